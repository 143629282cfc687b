// Package notifytest has a minimal SMTP server for tests: it speaks just
// enough of RFC 5321 (EHLO, MAIL, RCPT, DATA, QUIT) to receive a message.
package notifytest

import (
	"bufio"
	"net"
	"strings"
	"sync"
	"testing"
)

// Mail is one message the server received.
type Mail struct {
	From string
	To   []string
	Data string // headers and body, CRLF line ends, dot-stuffing undone
}

// SMTPServer receives mail on 127.0.0.1 until the test ends.
type SMTPServer struct {
	Addr string
	Mail chan Mail // every message received, in order

	ln net.Listener
	wg sync.WaitGroup
}

// NewSMTPServer starts a server; it stops when the test ends.
func NewSMTPServer(t testing.TB) *SMTPServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &SMTPServer{Addr: ln.Addr().String(), Mail: make(chan Mail, 100), ln: ln}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(func() {
		ln.Close()
		s.wg.Wait()
	})
	return s
}

func (s *SMTPServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			s.serve(c)
		}()
	}
}

func (s *SMTPServer) serve(c net.Conn) {
	r := bufio.NewReader(c)
	w := bufio.NewWriter(c)
	reply := func(line string) {
		w.WriteString(line + "\r\n")
		w.Flush()
	}
	reply("220 notifytest ESMTP")
	var m Mail
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimRight(line, "\r\n")
		verb := strings.ToUpper(strings.SplitN(line, " ", 2)[0])
		switch verb {
		case "EHLO", "HELO":
			reply("250-notifytest")
			reply("250 8BITMIME")
		case "MAIL":
			m = Mail{From: addr(line)}
			reply("250 OK")
		case "RCPT":
			m.To = append(m.To, addr(line))
			reply("250 OK")
		case "DATA":
			reply("354 go ahead")
			var data strings.Builder
			for {
				l, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if l == ".\r\n" {
					break
				}
				data.WriteString(strings.TrimPrefix(l, "."))
			}
			m.Data = data.String()
			s.Mail <- m
			reply("250 OK: queued")
		case "RSET", "NOOP":
			reply("250 OK")
		case "QUIT":
			reply("221 bye")
			return
		default:
			reply("502 not implemented")
		}
	}
}

// addr takes the address out of "MAIL FROM:<a@b> BODY=8BITMIME".
func addr(line string) string {
	_, rest, _ := strings.Cut(line, "<")
	a, _, _ := strings.Cut(rest, ">")
	return a
}
