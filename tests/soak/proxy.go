package soak

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy is a TCP proxy in front of the API server, for the operator's kubeconfig: the TLS
// session runs end to end through it (the API server's certificate names 127.0.0.1), so
// it can delay and cut connections but sees nothing of what they carry. client-go sends
// every request and watch of a process over one HTTP/2 connection, so a cut drops the
// operator's watches and its requests in flight at once, as a restarted API server or a
// load balancer that drops idle connections would.
type Proxy struct {
	ln     net.Listener
	target string
	cfg    ProxyConfig

	mu     sync.Mutex
	rng    *rand.Rand
	conns  map[*proxyConn]struct{}
	paused chan struct{} // closed when no outage is on; replaced during one
	closed bool
	wg     sync.WaitGroup

	delays, cuts, outages atomic.Int64
}

// ProxyConfig says how often the proxy delays traffic by itself; cuts and outages are
// asked for by the caller (CutOne, CutAll, Outage).
type ProxyConfig struct {
	// DelayProbability is the chance that a new connection, or one read from the client,
	// is held back by up to MaxDelay before it goes on.
	DelayProbability float64
	MaxDelay         time.Duration
	// Seed makes the delays repeatable.
	Seed uint64
}

type proxyConn struct {
	client, server net.Conn
	once           sync.Once
}

func (c *proxyConn) close() {
	c.once.Do(func() {
		_ = c.client.Close()
		if c.server != nil {
			_ = c.server.Close()
		}
	})
}

// StartProxy listens on a free port of 127.0.0.1 and forwards to target (host:port).
func StartProxy(target string, cfg ProxyConfig) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening for the API server proxy: %w", err)
	}
	open := make(chan struct{})
	close(open)
	p := &Proxy{ln: ln, target: target, cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 1)),
		conns: map[*proxyConn]struct{}{}, paused: open}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Counts are the faults the proxy caused so far.
func (p *Proxy) Counts() (delays, cuts, outages int64) {
	return p.delays.Load(), p.cuts.Load(), p.outages.Load()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		pc := &proxyConn{client: c}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return
		}
		p.conns[pc] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.handle(pc)
	}
}

// maybeDelay holds traffic back: during an outage until it ends, else now and then for a
// random time up to MaxDelay.
func (p *Proxy) maybeDelay() {
	p.mu.Lock()
	paused := p.paused
	var d time.Duration
	if p.cfg.MaxDelay > 0 && p.rng.Float64() < p.cfg.DelayProbability {
		d = time.Duration(p.rng.Int64N(int64(p.cfg.MaxDelay)))
	}
	p.mu.Unlock()
	<-paused
	if d > 0 {
		p.delays.Add(1)
		time.Sleep(d)
	}
}

func (p *Proxy) handle(pc *proxyConn) {
	defer p.wg.Done()
	defer func() {
		pc.close()
		p.mu.Lock()
		delete(p.conns, pc)
		p.mu.Unlock()
	}()
	p.maybeDelay()
	server, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	if err != nil {
		return
	}
	p.mu.Lock()
	_, open := p.conns[pc]
	pc.server = server
	p.mu.Unlock()
	if !open {
		_ = server.Close()
		return
	}
	done := make(chan struct{}, 2)
	go func() {
		// Client to server: requests, each read possibly held back.
		buf := make([]byte, 32<<10)
		for {
			n, err := pc.client.Read(buf)
			if n > 0 {
				p.maybeDelay()
				if _, werr := server.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(pc.client, server)
		done <- struct{}{}
	}()
	<-done
}

// CutOne closes one open connection, chosen at random, with whatever it carries (the
// operator's watches among it). It reports whether there was one.
func (p *Proxy) CutOne() bool {
	p.mu.Lock()
	var all []*proxyConn
	for c := range p.conns {
		all = append(all, c)
	}
	var victim *proxyConn
	if len(all) > 0 {
		victim = all[p.rng.IntN(len(all))]
		delete(p.conns, victim)
	}
	p.mu.Unlock()
	if victim == nil {
		return false
	}
	p.cuts.Add(1)
	victim.close()
	return true
}

// CutAll closes every open connection and returns how many.
func (p *Proxy) CutAll() int {
	p.mu.Lock()
	all := p.conns
	p.conns = map[*proxyConn]struct{}{}
	p.mu.Unlock()
	for c := range all {
		c.close()
	}
	p.cuts.Add(int64(len(all)))
	return len(all)
}

// Outage stops all traffic for d (nothing is forwarded, new connections wait), then cuts
// the connections that were open when it began: an API server that hangs and restarts.
func (p *Proxy) Outage(d time.Duration) {
	p.mu.Lock()
	pause := make(chan struct{})
	p.paused = pause
	before := p.conns
	p.conns = map[*proxyConn]struct{}{}
	p.mu.Unlock()
	p.outages.Add(1)
	time.Sleep(d)
	for c := range before {
		c.close()
	}
	p.cuts.Add(int64(len(before)))
	p.mu.Lock()
	p.paused = closedChan()
	p.mu.Unlock()
	close(pause)
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// Close stops listening and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.CutAll()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
