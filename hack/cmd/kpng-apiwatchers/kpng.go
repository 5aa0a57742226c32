//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"sigs.k8s.io/kpng/client/remote"
	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/proc"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// kpngSet is n `kpng kube … to-api` controllers, each reaching the API
// server through a relay that counts what the API server sends, and each
// watched by one backend that says when the controller holds the state
// and each change.
type kpngSet struct {
	*group
	cfg      config
	ctls     []*controller
	cancel   context.CancelFunc
	syncedCh chan struct{}
}

// controller is one controller process, its relay and its backend.
type controller struct {
	relay   *relay
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
	sink    *probeSink
}

// startControllers starts n controllers against cp.
func startControllers(ctx context.Context, cfg config, cp *controlplane.ControlPlane, tr *tracker, n int) (watcherSet, error) {
	ctx, cancel := context.WithCancel(ctx)
	set := &kpngSet{group: newGroup(), cfg: cfg, cancel: cancel, syncedCh: make(chan struct{})}
	u, err := url.Parse(cp.Host())
	if err != nil {
		cancel()
		return nil, fmt.Errorf("API server address %s: %w", cp.Host(), err)
	}
	for k := range n {
		ctl, err := set.start(ctx, cp, u.Host, tr, k)
		if ctl != nil {
			set.ctls = append(set.ctls, ctl)
		}
		if err != nil {
			set.stop()
			return nil, fmt.Errorf("controller %d: %w", k, err)
		}
	}
	go func() {
		for _, ctl := range set.ctls {
			select {
			case <-ctl.sink.syncedCh:
			case <-ctx.Done():
				return
			}
		}
		close(set.syncedCh)
	}()
	return set, nil
}

// start starts controller k: its relay to apiAddr, a kubeconfig naming
// the relay, the process, and its backend.
func (s *kpngSet) start(ctx context.Context, cp *controlplane.ControlPlane, apiAddr string, tr *tracker, k int) (*controller, error) {
	r, err := newRelay(apiAddr)
	if err != nil {
		return nil, err
	}
	ctl := &controller{relay: r, logPath: filepath.Join(s.cfg.dir, fmt.Sprintf("controller-%d.log", k)), exited: make(chan struct{}),
		sink: &probeSink{seer: seer{tr: tr}, ns: s.cfg.namespace, want: s.cfg.services, held: map[string]bool{}, syncedCh: make(chan struct{})}}
	kc, err := clientcmd.LoadFromFile(cp.KubeconfigPath())
	if err != nil {
		r.close()
		return nil, fmt.Errorf("kubeconfig %s: %w", cp.KubeconfigPath(), err)
	}
	for _, c := range kc.Clusters {
		c.Server = "https://" + r.addr()
	}
	kubeconfig := filepath.Join(s.cfg.dir, fmt.Sprintf("kubeconfig-%d", k))
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		r.close()
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	socket := filepath.Join(s.cfg.dir, fmt.Sprintf("kpng-%d.sock", k))
	_ = os.Remove(socket)
	args := append(slices.Clone(s.cfg.kpng[1:]), "kube", "--kubeconfig="+kubeconfig, "--node-name=apiwatchers-controller")
	if s.cfg.proxyName != "" {
		args = append(args, "--service-proxy-name="+s.cfg.proxyName)
	}
	args = append(args, "to-api", "--listen=unix://"+socket)
	log, err := os.Create(ctl.logPath)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("log: %w", err)
	}
	ctl.cmd = exec.Command(s.cfg.kpng[0], args...)
	ctl.cmd.Env = append(os.Environ(), s.cfg.env...)
	ctl.cmd.Stdout, ctl.cmd.Stderr = log, log
	ctl.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := ctl.cmd.Start(); err != nil {
		log.Close()
		r.close()
		return nil, fmt.Errorf("start %s: %w", s.cfg.kpng[0], err)
	}
	go func() {
		err := ctl.cmd.Wait()
		log.Close()
		close(ctl.exited)
		if ctx.Err() == nil {
			s.fail(fmt.Errorf("controller %d exited (%v): %s", k, err, tail(ctl.logPath)))
		}
	}()
	// Its backend: the socket appears once the controller listens, and
	// remote.Run retries until then.
	s.wg.Go(func() {
		if err := remote.Run(ctx, remote.Config{Address: "unix://" + socket, NodeName: "apiwatchers-probe", MaxBackoff: 200 * time.Millisecond}, ctl.sink); err != nil {
			s.fail(fmt.Errorf("controller %d's backend: %w", k, err))
		}
	})
	return ctl, nil
}

func (s *kpngSet) synced() <-chan struct{} { return s.syncedCh }

// objects is not known: the controllers' own.
func (s *kpngSet) objects() int64 { return 0 }

// restarts is not known: the controllers' logs say.
func (s *kpngSet) restarts() int64 { return 0 }

func (s *kpngSet) bytes() int64 {
	var n int64
	for _, ctl := range s.ctls {
		n += ctl.relay.read.Load()
	}
	return n
}

// clientCPU is the controllers' CPU seconds, together.
func (s *kpngSet) clientCPU() float64 {
	var total float64
	for _, ctl := range s.ctls {
		if c, err := proc.CPUSeconds(ctl.cmd.Process.Pid); err == nil {
			total += c
		}
	}
	return total
}

// check counts the services of the run's namespace each controller's
// backend holds, and their endpoints.
func (s *kpngSet) check() []string {
	var problems []string
	for k, ctl := range s.ctls {
		ctl.sink.mu.Lock()
		svcs, eps := len(ctl.sink.held), ctl.sink.endpoints
		ctl.sink.mu.Unlock()
		if svcs != s.cfg.services || eps != s.cfg.services*s.cfg.endpoints {
			problems = append(problems, fmt.Sprintf("controller %d's backend holds %d services and %d endpoints, want %d and %d", k, svcs, eps, s.cfg.services, s.cfg.services*s.cfg.endpoints))
		}
	}
	return problems
}

// stop stops the backends, then the controllers (SIGTERM, SIGKILL after
// 10 s) and their relays.
func (s *kpngSet) stop() {
	s.cancel()
	s.wg.Wait()
	for _, ctl := range s.ctls {
		if ctl.cmd != nil && ctl.cmd.Process != nil {
			_ = ctl.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-ctl.exited:
			case <-time.After(10 * time.Second):
				_ = ctl.cmd.Process.Kill()
				<-ctl.exited
			}
		}
		ctl.relay.close()
	}
}

// tail returns the end of a log.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// probeSink is a controller's backend: it holds the services of its
// namespace (their endpoints counted) and counts the changes it holds.
type probeSink struct {
	seer
	ns        string
	want      int
	mu        sync.Mutex
	held      map[string]bool // services of ns
	endpoints int             // their endpoints
	syncOnce  sync.Once
	syncedCh  chan struct{}
}

// Reset drops the state: the next round describes it whole.
func (p *probeSink) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held, p.endpoints = map[string]bool{}, 0
}

// Update follows service key and counts the change in progress when the
// service holds it.
func (p *probeSink) Update(key model.ServiceKey, prev, cur *model.ServiceEndpoints) {
	if key.Namespace != p.ns {
		return
	}
	p.mu.Lock()
	if prev != nil {
		p.endpoints -= len(prev.Endpoints)
	}
	delete(p.held, key.Name)
	if cur != nil {
		p.held[key.Name] = true
		p.endpoints += len(cur.Endpoints)
	}
	p.mu.Unlock()
	t := p.tr.current.Load()
	if cur == nil || t == nil || key.Namespace != t.ns || key.Name != t.service {
		return
	}
	for _, ep := range cur.Endpoints {
		if ep != nil && slices.Contains(ep.IPs.V4, t.ip) && ep.Ready == t.ready {
			p.holds(t)
		}
	}
}

// Sync ends a round: the first that holds every service is the
// controller's initial state.
func (p *probeSink) Sync() error {
	p.mu.Lock()
	full := len(p.held) == p.want
	p.mu.Unlock()
	if full {
		p.syncOnce.Do(func() { close(p.syncedCh) })
	}
	return nil
}

var _ localsink.Sink = (*probeSink)(nil)

// relay forwards loopback TCP connections to the API server, counting
// the bytes the API server sends.
type relay struct {
	ln     net.Listener
	target string
	read   atomic.Int64
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
	wg     sync.WaitGroup
}

// newRelay listens on a loopback port and forwards to target.
func newRelay(target string) (*relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	r := &relay{ln: ln, target: target}
	r.wg.Go(r.serve)
	return r, nil
}

// addr is the relay's host:port.
func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", r.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			_, _ = c.Close(), up.Close()
			return
		}
		r.conns = append(r.conns, c, up)
		r.mu.Unlock()
		r.wg.Go(func() {
			_, _ = io.Copy(up, c)
			_ = up.(*net.TCPConn).CloseWrite()
		})
		r.wg.Go(func() {
			_, _ = io.Copy(c, &countingConn{Conn: up, n: &r.read})
			_ = c.(*net.TCPConn).CloseWrite()
		})
	}
}

// close stops the relay and its connections, and waits for them.
func (r *relay) close() {
	_ = r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}
