package clusterdns

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func service(ns, name, ip string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{ClusterIP: ip}}
}

// serve starts s on a loopback port and returns its address.
func serve(t *testing.T, s *Server) string {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(ctx, conn) }()
	t.Cleanup(func() { cancel(); <-done })
	return conn.LocalAddr().String()
}

func ask(t *testing.T, addr, name string, qtype dnsmessage.Type) (dnsmessage.RCode, []string) {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
	require.NoError(t, b.StartQuestions())
	require.NoError(t, b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: qtype, Class: dnsmessage.ClassINET}))
	q, err := b.Finish()
	require.NoError(t, err)
	conn, err := net.Dial("udp", addr)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
	_, err = conn.Write(q)
	require.NoError(t, err)
	buf := make([]byte, 1500)
	n, err := conn.Read(buf)
	require.NoError(t, err)
	var m dnsmessage.Message
	require.NoError(t, m.Unpack(buf[:n]))
	require.Equal(t, uint16(7), m.ID, "the reply answers the query")
	var ips []string
	for _, a := range m.Answers {
		if r, ok := a.Body.(*dnsmessage.AResource); ok {
			ips = append(ips, net.IP(r.A[:]).String())
		}
	}
	return m.RCode, ips
}

func TestAnswers(t *testing.T) {
	// The upstream is another Server, for a domain of its own: names outside the cluster
	// domain must be relayed to it and its answer returned unchanged.
	upstream := &Server{Domain: "upstream.test"}
	upstream.rebuild([]any{service("x", "elsewhere", "192.0.2.7")})
	s := &Server{Domain: "cluster.local", Upstream: serve(t, upstream)}
	s.rebuild([]any{
		service("ns1", "hand-off", "10.96.3.4"),
		service("ns1", "headless", corev1.ClusterIPNone),
		service("default", "kubernetes", "10.96.0.1"),
	})
	addr := serve(t, s)

	for _, tc := range []struct {
		name  string
		qtype dnsmessage.Type
		rcode dnsmessage.RCode
		ips   []string
	}{
		{"hand-off.ns1.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"10.96.3.4"}},
		{"Hand-Off.NS1.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"10.96.3.4"}},
		{"kubernetes.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"10.96.0.1"}},
		// The name exists, with no IPv6 address.
		{"hand-off.ns1.svc.cluster.local.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, nil},
		// What a pod's search list tries first for "hand-off.ns1.svc".
		{"hand-off.ns1.svc.ns1.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"hand-off.ns2.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"headless.ns1.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"elsewhere.x.svc.upstream.test.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"192.0.2.7"}},
		{"nothing.x.svc.upstream.test.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
	} {
		t.Run(tc.name+"/"+tc.qtype.String(), func(t *testing.T) {
			rcode, ips := ask(t, addr, tc.name, tc.qtype)
			assert.Equal(t, tc.rcode, rcode)
			assert.Equal(t, tc.ips, ips)
		})
	}
}

func TestHostUpstream(t *testing.T) {
	got, err := HostUpstream("# generated\nsearch example\nnameserver 10.255.255.53\nnameserver 10.0.0.2\n")
	require.NoError(t, err)
	assert.Equal(t, "10.255.255.53:53", got)
	_, err = HostUpstream("search example\n")
	assert.Error(t, err)
}
