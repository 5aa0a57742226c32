// Command kpng-apiflood is what a hostile or broken client can do to a
// kpng controller's gRPC API (`kpng … to-api`), measured: it opens
// connections and streams the way the attacks of issue 24 §4 did, holds
// them, and prints the controller's resident memory, open files and
// goroutines before, at their peak and after (docs/operating.md,
// Security). Loopback only: the connections come from 127.0.0.1, or from
// --sources addresses of 127.1.0.0/16 (each a different client to the
// controller's per-client limit).
//
//	kpng-apiflood --api=127.0.0.1:7000 --api-tls-ca=ca.pem --api-tls-cert=node.pem --api-tls-key=node-key.pem \
//	  --pid=$(pidof kpng) --metrics=http://127.0.0.1:10249/metrics --attack=streams --conns=1 --streams=200
//
// Attacks: streams (each stream reads its first state and stays open),
// stalled (each stream never reads), idle (each connection does its TLS
// handshake and sends the HTTP/2 preface and settings, then nothing).
// With --nodes the streams watch as many nodes (the certificate must be
// allowed any node's view: --tls-any-node-cn).
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/client/remote"
)

func main() {
	cfg := remote.Config{}
	flag.StringVar(&cfg.Address, "api", "", "the controller's TCP address (loopback)")
	flag.StringVar(&cfg.TLSCA, "api-tls-ca", "", "CA of the controller's certificate")
	flag.StringVar(&cfg.TLSCert, "api-tls-cert", "", "client certificate")
	flag.StringVar(&cfg.TLSKey, "api-tls-key", "", "client key")
	flag.BoolVar(&cfg.Insecure, "api-insecure", false, "plain TCP")
	attack := flag.String("attack", "streams", "streams, stalled or idle")
	conns := flag.Int("conns", 1, "connections")
	streams := flag.Int("streams", 1, "streams per connection (streams and stalled)")
	sources := flag.Int("sources", 1, "client addresses: 127.0.0.1, or this many of 127.1.0.0/16")
	node := flag.String("node", "node-a", "the node name the streams watch as")
	nodes := flag.Int("nodes", 0, "watch as node-0 … node-(N-1) in turn instead (a certificate allowed any node's view)")
	pid := flag.Int("pid", 0, "the controller's process")
	metricsURL := flag.String("metrics", "", "the controller's metrics URL, for its goroutines")
	hold := flag.Duration("hold", 40*time.Second, "how long the connections are held")
	settle := flag.Duration("settle", 10*time.Second, "how long after closing them the controller is measured again")
	flag.Parse()
	if cfg.Address == "" || *pid == 0 || *conns < 1 || *streams < 1 || *sources < 1 || *sources > 65000 {
		fmt.Fprintln(os.Stderr, "usage: kpng-apiflood --api=ADDR --pid=PID [--attack=streams|stalled|idle] [--conns=N] [--streams=N] [--sources=N] [TLS flags]")
		os.Exit(2)
	}
	target, opts, err := cfg.DialOptions()
	if err != nil {
		fail(err)
	}
	tlsCfg, err := clientTLS(cfg)
	if err != nil {
		fail(err)
	}
	p := probe{pid: *pid, metrics: *metricsURL}
	before := p.sample()
	ctx, cancel := context.WithCancel(context.Background())
	var served, refused atomic.Int64
	var closers []io.Closer
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range *conns {
		src := "127.0.0.1"
		if *sources > 1 {
			k := i%*sources + 1
			src = fmt.Sprintf("127.1.%d.%d", k>>8, k&0xff)
		}
		dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
		if *attack == "idle" {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := idleConn(dialer, cfg.Address, tlsCfg)
				if err != nil {
					refused.Add(1)
					return
				}
				served.Add(1)
				mu.Lock()
				closers = append(closers, c)
				mu.Unlock()
			}()
			continue
		}
		copts := append(opts, grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			return dialer.DialContext(ctx, "tcp", cfg.Address)
		}))
		conn, err := grpc.NewClient(target, copts...)
		if err != nil {
			fail(err)
		}
		closers = append(closers, conn)
		client := kpngv1.NewControllerClient(conn)
		for j := range *streams {
			name := *node
			if *nodes > 0 {
				name = fmt.Sprintf("node-%d", (i**streams+j)%*nodes)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				stream, err := client.Watch(ctx, &kpngv1.WatchRequest{NodeName: name})
				if err != nil {
					if ctx.Err() == nil {
						refused.Add(1)
					}
					return
				}
				if *attack == "stalled" {
					served.Add(1) // it never reads: the stream is open
					<-ctx.Done()
					return
				}
				for {
					b, err := stream.Recv()
					if err != nil {
						if ctx.Err() == nil {
							refused.Add(1)
						}
						return
					}
					if synced(b) {
						served.Add(1)
						<-ctx.Done()
						return
					}
				}
			}()
		}
	}
	total := *conns * *streams
	if *attack == "idle" {
		total = *conns
	}
	peak := before
	start := time.Now()
	for time.Since(start) < *hold {
		time.Sleep(200 * time.Millisecond)
		peak = peak.max(p.sample())
	}
	held := p.sample()
	heldServed, heldFailed := served.Load(), refused.Load()
	cancel()
	mu.Lock()
	for _, c := range closers {
		c.Close()
	}
	mu.Unlock()
	wg.Wait()
	time.Sleep(*settle)
	after := p.sample()
	fmt.Printf("attack=%s conns=%d streams=%d sources=%d served=%d failed=%d waiting=%d hold=%v rss_before_mib=%.0f rss_peak_mib=%.0f rss_held_mib=%.0f rss_after_mib=%.0f fds_before=%d fds_peak=%d fds_held=%d fds_after=%d goroutines_before=%d goroutines_peak=%d goroutines_held=%d goroutines_after=%d backends_peak=%d backends_held=%d\n",
		*attack, *conns, *streams, *sources, heldServed, heldFailed, int64(total)-heldServed-heldFailed, *hold,
		before.rssMiB, peak.rssMiB, held.rssMiB, after.rssMiB, before.fds, peak.fds, held.fds, after.fds, before.goroutines, peak.goroutines, held.goroutines, after.goroutines, peak.backends, held.backends)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kpng-apiflood:", err)
	os.Exit(1)
}

// synced tells whether a batch ends a round.
func synced(b *kpngv1.Batch) bool {
	for _, op := range b.GetOps() {
		if op.GetSync() != nil {
			return true
		}
	}
	return false
}

// clientTLS is the TLS configuration of the idle connections (nil: plain
// TCP).
func clientTLS(cfg remote.Config) (*tls.Config, error) {
	if cfg.Insecure {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}, InsecureSkipVerify: true} //nolint:gosec // a load tool on loopback
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("load client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// idleConn connects, does the TLS handshake, sends the HTTP/2 preface and
// settings, and reads the server's first frame (the connection is
// served).
func idleConn(d *net.Dialer, addr string, cfg *tls.Config) (net.Conn, error) {
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	if cfg != nil {
		tc := tls.Client(c, cfg)
		if err := tc.Handshake(); err != nil {
			c.Close()
			return nil, err
		}
		c = tc
	}
	_, err = io.WriteString(c, http2.ClientPreface)
	if err == nil {
		err = http2.NewFramer(c, nil).WriteSettings()
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := http2.NewFramer(io.Discard, c).ReadFrame(); err != nil {
		c.Close()
		return nil, err
	}
	c.SetReadDeadline(time.Time{})
	// Keep reading (and dropping) what the server sends, so that its
	// GOAWAY and close are seen.
	go func() { _, _ = io.Copy(io.Discard, c) }()
	return c, nil
}

// probe reads a process's figures.
type probe struct {
	pid     int
	metrics string
}

type sample struct {
	rssMiB                    float64
	fds, goroutines, backends int
}

func (a sample) max(b sample) sample {
	return sample{max(a.rssMiB, b.rssMiB), max(a.fds, b.fds), max(a.goroutines, b.goroutines), max(a.backends, b.backends)}
}

func (p probe) sample() sample {
	var s sample
	if f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.pid)); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
				kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
				s.rssMiB = float64(kb) / 1024
			}
		}
		f.Close()
	}
	if fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.pid)); err == nil {
		s.fds = len(fds)
	}
	if p.metrics != "" {
		s.goroutines, s.backends = gauges(p.metrics)
	}
	return s
}

// gauges reads go_goroutines and kpng_api_backends (the backends
// watching) from a metrics page.
func gauges(url string) (goroutines, backends int) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		return 0, 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ") // no space in the labels
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			continue
		}
		name, _, _ = strings.Cut(name, "{")
		switch name {
		case "go_goroutines":
			goroutines = int(f)
		case "kpng_api_backends":
			backends = int(f)
		}
	}
	return goroutines, backends
}
