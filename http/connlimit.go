package fleethttp

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// connLimit is a listener that closes, as soon as they are accepted,
// connections beyond a cap in total and per source address: at 10129e9
// one client's ~20,000 keep-alive connections reached the descriptor
// limit, and then no one could connect.
type connLimit struct {
	net.Listener
	max, perAddr int // ≤ 0: no cap

	mu      sync.Mutex
	total   int
	byAddr  map[netip.Addr]int
	refused atomic.Uint64
}

func (l *connLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		var addr netip.Addr
		if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
			addr = ap.Addr().Unmap()
		}
		l.mu.Lock()
		ok := (l.max <= 0 || l.total < l.max) && (l.perAddr <= 0 || l.byAddr[addr] < l.perAddr)
		if ok {
			l.total++
			l.byAddr[addr]++
		}
		l.mu.Unlock()
		if !ok {
			l.refused.Add(1)
			c.Close()
			continue
		}
		return &limitedConn{Conn: c, l: l, addr: addr}, nil
	}
}

func (l *connLimit) release(addr netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.byAddr[addr]--; l.byAddr[addr] <= 0 {
		delete(l.byAddr, addr)
	}
}

// limitedConn gives its place back when it closes, once.
type limitedConn struct {
	net.Conn
	l    *connLimit
	addr netip.Addr
	once sync.Once
}

func (c *limitedConn) Close() error {
	c.once.Do(func() { c.l.release(c.addr) })
	return c.Conn.Close()
}

// NetConn is the connection under the cap's count, which changes no byte:
// a remote session's stream leg splices its TCP connection
// (remote.Relay).
func (c *limitedConn) NetConn() net.Conn { return c.Conn }

// CloseWrite is the TCP connection's: the server half-closes a connection
// it gives up on and lets the client read the answer before it resets
// (net/http's rstAvoidanceDelay); without it the client sees a reset.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
