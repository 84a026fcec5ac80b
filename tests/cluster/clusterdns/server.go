// Package clusterdns is the local node's cluster DNS: it answers `<service>.<namespace>.svc.<domain>`
// with the Service's ClusterIP, as CoreDNS does on a real cluster, and passes every other name
// to the host's resolver. With kube-proxy serving the ClusterIPs, pods on the node reach
// Services by name, so what runs in a pod (a warm pod's supervisor calling the operator's
// hand-off Service, say) is configured as on any cluster.
//
// It serves A records for ClusterIP Services only: the tests need nothing else, and a name it
// does not know inside the cluster domain is answered NXDOMAIN at once rather than sent out.
package clusterdns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// ttl is short so that a Service recreated under the same name is found at its new address
// within seconds.
const ttl = 5

// upstreamTimeout bounds a forwarded query: the pod's resolver retries on its own.
const upstreamTimeout = 3 * time.Second

// Server answers DNS queries over UDP.
type Server struct {
	// Domain is the cluster domain, e.g. "cluster.local" (the kubelet's clusterDomain).
	Domain string
	// Upstream is where other names go, "host:port" (the host's resolv.conf nameserver).
	Upstream string
	// Logf reports what went wrong; nil discards it.
	Logf func(string, ...any)

	mu       sync.RWMutex
	services map[string][4]byte // "<name>.<namespace>" -> ClusterIP
}

// Watch keeps the Service table current from the API server until ctx ends. It returns once
// the first list has been seen.
func (s *Server) Watch(ctx context.Context, cs kubernetes.Interface) error {
	factory := informers.NewSharedInformerFactory(cs, 0)
	inf := factory.Core().V1().Services().Informer()
	update := func(any) { s.rebuild(inf.GetStore().List()) }
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    update,
		UpdateFunc: func(_, n any) { update(n) },
		DeleteFunc: update,
	}); err != nil {
		return fmt.Errorf("watching Services: %w", err)
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return errors.New("the Service list never arrived from the API server")
	}
	update(nil)
	return nil
}

// rebuild replaces the table from the informer's store: Services change rarely on the node,
// and a whole rebuild cannot miss a deletion.
func (s *Server) rebuild(objs []any) {
	table := make(map[string][4]byte, len(objs))
	for _, o := range objs {
		svc, ok := o.(*corev1.Service)
		if !ok {
			continue
		}
		ip := net.ParseIP(svc.Spec.ClusterIP).To4()
		if ip == nil {
			continue // headless, or IPv6: not served
		}
		table[svc.Name+"."+svc.Namespace] = [4]byte(ip)
	}
	s.mu.Lock()
	s.services = table
	s.mu.Unlock()
}

// Serve answers on conn until ctx ends.
func (s *Server) Serve(ctx context.Context, conn net.PacketConn) error {
	go func() { <-ctx.Done(); _ = conn.Close() }()
	buf := make([]byte, 1500)
	for {
		n, addr, err := conn.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("reading a query: %w", err)
		}
		query := append([]byte(nil), buf[:n]...)
		go func() {
			answer, err := s.answer(query)
			if err != nil {
				s.logf("query from %s: %v", addr, err)
				return
			}
			if _, err := conn.WriteTo(answer, addr); err != nil && ctx.Err() == nil {
				s.logf("answering %s: %v", addr, err)
			}
		}()
	}
}

func (s *Server) logf(format string, args ...any) {
	if s.Logf != nil {
		s.Logf(format, args...)
	}
}

// answer returns the reply to one query: from the Service table for the cluster domain,
// from upstream for anything else.
func (s *Server) answer(query []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, fmt.Errorf("parsing: %w", err)
	}
	q, err := p.Question()
	if err != nil {
		return nil, fmt.Errorf("parsing the question: %w", err)
	}
	name := strings.ToLower(strings.TrimSuffix(q.Name.String(), "."))
	domain := strings.ToLower(strings.Trim(s.Domain, "."))
	if name != domain && !strings.HasSuffix(name, "."+domain) {
		return s.forward(query)
	}
	ip, found := s.lookup(strings.TrimSuffix(name, "."+domain))
	rcode := dnsmessage.RCodeSuccess
	if !found {
		rcode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{
		ID: h.ID, Response: true, Authoritative: true,
		RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rcode,
	})
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	// A known name asked for another type (AAAA, say) is answered with no records, not
	// NXDOMAIN: the name exists.
	if found && q.Type == dnsmessage.TypeA {
		if err := b.StartAnswers(); err != nil {
			return nil, err
		}
		if err := b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: ttl},
			dnsmessage.AResource{A: ip}); err != nil {
			return nil, err
		}
	}
	return b.Finish()
}

// lookup finds "<service>.<namespace>.svc" (the cluster domain already cut off).
func (s *Server) lookup(rel string) ([4]byte, bool) {
	svcNS, ok := strings.CutSuffix(rel, ".svc")
	if !ok || strings.Count(svcNS, ".") != 1 {
		return [4]byte{}, false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	ip, ok := s.services[svcNS]
	return ip, ok
}

// forward relays a query to the upstream resolver and returns its reply unchanged.
func (s *Server) forward(query []byte) ([]byte, error) {
	if s.Upstream == "" {
		return nil, errors.New("a name outside the cluster domain and no upstream resolver")
	}
	conn, err := net.Dial("udp", s.Upstream)
	if err != nil {
		return nil, fmt.Errorf("reaching the upstream resolver %s: %w", s.Upstream, err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(upstreamTimeout))
	if _, err := conn.Write(query); err != nil {
		return nil, fmt.Errorf("forwarding to %s: %w", s.Upstream, err)
	}
	buf := make([]byte, 65535)
	n, err := conn.Read(buf)
	if err != nil {
		return nil, fmt.Errorf("waiting for %s: %w", s.Upstream, err)
	}
	return buf[:n], nil
}

// HostUpstream is the first nameserver of the host's resolv.conf, as "host:53".
func HostUpstream(resolvConf string) (string, error) {
	for _, line := range strings.Split(resolvConf, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			return net.JoinHostPort(f[1], "53"), nil
		}
	}
	return "", errors.New("no nameserver in the host's resolv.conf")
}
