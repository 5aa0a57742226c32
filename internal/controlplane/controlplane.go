// Package controlplane runs a real etcd and kube-apiserver on loopback for
// integration tests of the kpng library.
//
// The binaries are built from the Go module proxy by
// hack/build-controlplane.sh (see Binaries) and cached between runs. A test
// package typically starts one control plane for all its tests from
// TestMain:
//
//	var cp *controlplane.ControlPlane
//
//	func TestMain(m *testing.M) { controlplane.Main(m, &cp) }
//
// Only etcd and kube-apiserver run: there is no controller manager, scheduler
// or kubelet. Objects are stored and served, but nothing reconciles them:
// for example deleted namespaces stay Terminating, and no ServiceAccount or
// Endpoints objects are created automatically. The admin identity is a
// static token in group system:masters, so RBAC never denies it.
package controlplane

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"sigs.k8s.io/kpng/internal/proc"
)

const (
	// ServiceClusterIPRange is the dual-stack service CIDR pair given to
	// kube-apiserver, IPv4 first.
	ServiceClusterIPRange = "10.96.0.0/16,fd00:10:96::/108"

	// ServiceAccountIssuer is the issuer of service account tokens.
	ServiceAccountIssuer = "https://kubernetes.default.svc"

	// AdminUser is the user name of the static admin token. The user is in
	// group system:masters.
	AdminUser = "admin"

	// DefaultReadyTimeout is how long Start and StartAPIServer wait for
	// kube-apiserver to report ready, unless WithReadyTimeout says otherwise.
	DefaultReadyTimeout = 90 * time.Second

	// etcdHealthTimeout is how long to wait for etcd to report healthy.
	etcdHealthTimeout = 30 * time.Second

	// stopGrace is how long a stopped process may take to exit after
	// SIGTERM before it is killed.
	stopGrace = 15 * time.Second

	// portAttempts is how often Start retries with fresh ports when a
	// process could not bind the ports it was given.
	portAttempts = 3

	// dirPrefix is the name prefix of control plane directories in
	// os.TempDir.
	dirPrefix = "kpng-controlplane-"

	// ownerFile, in a control plane directory, holds the pid of the process
	// that owns it.
	ownerFile = "owner.pid"

	// logTailLines is how many log lines errors include.
	logTailLines = 40
)

// Option configures Start.
type Option func(*options)

type options struct {
	binaryDir     string
	logf          func(format string, args ...any)
	readyTimeout  time.Duration
	apiServerArgs []string
}

// WithBinaryDir makes Start use the kube-apiserver and etcd binaries in dir
// instead of calling Binaries.
func WithBinaryDir(dir string) Option {
	return func(o *options) { o.binaryDir = dir }
}

// WithLogf makes the control plane report its progress (start-up times,
// stops and restarts) through logf, for example (*testing.T).Logf. By
// default progress is not reported.
func WithLogf(logf func(format string, args ...any)) Option {
	return func(o *options) { o.logf = logf }
}

// WithReadyTimeout sets how long Start and StartAPIServer wait for
// kube-apiserver to become ready. The default is DefaultReadyTimeout.
func WithReadyTimeout(d time.Duration) Option {
	return func(o *options) { o.readyTimeout = d }
}

// WithAPIServerArgs appends flags to the kube-apiserver command line. For
// scalar flags the last value wins, so these override the defaults; list
// flags such as --disable-admission-plugins accumulate.
func WithAPIServerArgs(args ...string) Option {
	return func(o *options) { o.apiServerArgs = append(o.apiServerArgs, args...) }
}

// ControlPlane is a running etcd and kube-apiserver on 127.0.0.1, with all
// their state in a private temporary directory. Create it with Start and
// release it with Stop. Its methods are safe for concurrent use.
type ControlPlane struct {
	opts       options
	dir        string
	binaryDir  string
	token      string
	etcdURL    string
	etcdArgs   []string
	apiPort    int
	apiArgs    []string
	kubeconfig string

	// opMu serializes Stop, StopAPIServer, KillAPIServer,
	// StartAPIServer, KillEtcd and StartEtcd.
	opMu sync.Mutex

	mu        sync.Mutex // guards the fields below
	etcd      *process
	apiserver *process
	config    *rest.Config
	client    kubernetes.Interface
	stopped   bool
}

// Start starts etcd and kube-apiserver and waits until kube-apiserver is
// ready. On failure it cleans up everything it started and returns an error
// that includes the tail of the failing process's log.
//
// In a test binary run with -short (make unit), Start fails at once,
// building and starting nothing: make unit must need no control plane, so a
// test that starts one calls SkipIfShort first (or uses Main and Require).
func Start(opts ...Option) (*ControlPlane, error) {
	if testing.Testing() && flag.Parsed() && testing.Short() {
		return nil, errors.New("controlplane: Start under -short (make unit builds and starts no control plane): call controlplane.SkipIfShort first")
	}
	o := options{readyTimeout: DefaultReadyTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	if o.logf == nil {
		o.logf = func(string, ...any) {}
	}

	binaryDir := o.binaryDir
	if binaryDir == "" {
		var err error
		if binaryDir, err = Binaries(); err != nil {
			return nil, fmt.Errorf("getting control plane binaries: %w", err)
		}
	} else if err := checkBinaries(binaryDir); err != nil {
		return nil, err
	}

	removeAbandonedDirs(o.logf)
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("creating control plane directory: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("writing control plane owner file: %w", err)
	}
	cp := &ControlPlane{opts: o, dir: dir, binaryDir: binaryDir}
	if err := cp.start(); err != nil {
		if stopErr := cp.Stop(); stopErr != nil {
			err = errors.Join(err, fmt.Errorf("cleaning up: %w", stopErr))
		}
		return nil, err
	}
	return cp, nil
}

// removeAbandonedDirs removes the directories of control planes whose
// process died without calling Stop (a panic, a test timeout, SIGKILL): their
// etcd and kube-apiserver died with them, but etcd's data (over 100MB of
// preallocated WAL) would stay behind.
func removeAbandonedDirs(logf func(format string, args ...any)) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // being created, or not ours
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || pid <= 0 || pid == os.Getpid() || proc.Alive(pid) {
			continue
		}
		if err := os.RemoveAll(dir); err == nil {
			logf("controlplane: removed %s, abandoned by process %d", dir, pid)
		}
	}
}

// start does the work of Start; the caller cleans up on error.
func (c *ControlPlane) start() error {
	begin := time.Now()
	if err := c.writeCredentials(); err != nil {
		return err
	}

	if err := c.startEtcd(); err != nil {
		return err
	}
	c.opts.logf("controlplane: etcd healthy at %s after %v", c.etcdURL, time.Since(begin).Round(time.Millisecond))

	apiBegin := time.Now()
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(1)
		if err != nil {
			return err
		}
		c.apiPort = ports[0]
		c.apiArgs = c.apiServerArgs()
		err = c.runAPIServer()
		if err == nil {
			break
		}
		if attempt >= portAttempts || !addrInUse(c.apiServerLogPath()) {
			return err
		}
		c.opts.logf("controlplane: kube-apiserver port %d was taken, retrying with another one", c.apiPort)
	}
	c.opts.logf("controlplane: kube-apiserver ready at %s after %v (%v in total)", c.Host(),
		time.Since(apiBegin).Round(time.Millisecond), time.Since(begin).Round(time.Millisecond))

	client, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		return fmt.Errorf("creating client for the control plane: %w", err)
	}
	c.client = client

	c.kubeconfig = filepath.Join(c.dir, "kubeconfig")
	if err := clientcmd.WriteToFile(c.kubeconfigData(), c.kubeconfig); err != nil {
		return fmt.Errorf("writing kubeconfig: %w", err)
	}
	return nil
}

// writeCredentials writes the service account key pair and the static token
// file.
func (c *ControlPlane) writeCredentials() error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("generating service account key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return fmt.Errorf("encoding service account public key: %w", err)
	}
	files := map[string][]byte{
		"sa.key": pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		"sa.pub": pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
	}

	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		return fmt.Errorf("generating admin token: %w", err)
	}
	c.token = hex.EncodeToString(token)
	// token,user,uid,"group1,group2"
	files["tokens.csv"] = fmt.Appendf(nil, "%s,%s,%s,\"system:masters\"\n", c.token, AdminUser, AdminUser)

	for name, data := range files {
		if err := os.WriteFile(filepath.Join(c.dir, name), data, 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
	}
	return nil
}

// startEtcd starts etcd on fresh ports and waits until it is healthy.
func (c *ControlPlane) startEtcd() error {
	for attempt := 1; ; attempt++ {
		err := c.startEtcdOnce()
		if err == nil {
			return nil
		}
		if attempt >= portAttempts || !addrInUse(c.etcdLogPath()) {
			return err
		}
		c.opts.logf("controlplane: etcd ports were taken, retrying with other ones")
	}
}

func (c *ControlPlane) startEtcdOnce() error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	dataDir := filepath.Join(c.dir, "etcd")
	if err := os.RemoveAll(dataDir); err != nil {
		return fmt.Errorf("clearing etcd data directory: %w", err)
	}
	c.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	args := []string{
		"--name=kpng",
		"--data-dir=" + dataDir,
		"--listen-client-urls=" + c.etcdURL,
		"--advertise-client-urls=" + c.etcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=kpng=" + peerURL,
		"--initial-cluster-state=new",
		"--unsafe-no-fsync",
	}
	c.etcdArgs = args
	return c.runEtcd()
}

// runEtcd starts etcd with c.etcdArgs and waits until it is healthy. The
// caller must not hold c.mu.
func (c *ControlPlane) runEtcd() error {
	p, err := startProcess("etcd", filepath.Join(c.binaryDir, EtcdBinary), c.etcdArgs, c.etcdLogPath())
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.etcd = p
	c.mu.Unlock()

	httpClient := &http.Client{Timeout: 2 * time.Second}
	err = poll(p, etcdHealthTimeout, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.etcdURL+"/health", nil)
		if err != nil {
			return err
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			return fmt.Errorf("%w: %v", errNotReady, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"health":"true"`) {
			return fmt.Errorf("%w: %s: %s", errNotReady, resp.Status, strings.TrimSpace(string(body)))
		}
		return nil
	})
	if err != nil {
		stopErr := p.stop(syscall.SIGKILL, 0)
		return errors.Join(fmt.Errorf("waiting for etcd at %s to be healthy: %w\nlast lines of the etcd log:\n%s",
			c.etcdURL, err, logTail(c.etcdLogPath(), logTailLines)), stopErr)
	}
	return nil
}

// apiServerArgs returns the kube-apiserver command line.
func (c *ControlPlane) apiServerArgs() []string {
	args := []string{
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(c.apiPort),
		"--etcd-servers=" + c.etcdURL,
		"--cert-dir=" + filepath.Join(c.dir, "apiserver-certs"),
		"--token-auth-file=" + filepath.Join(c.dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=" + ServiceAccountIssuer,
		"--service-account-key-file=" + filepath.Join(c.dir, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(c.dir, "sa.key"),
		"--service-cluster-ip-range=" + ServiceClusterIPRange,
		"--allow-privileged=true",
		"--disable-admission-plugins=ServiceAccount",
		"--endpoint-reconciler-type=none",
	}
	return append(args, c.opts.apiServerArgs...)
}

// runAPIServer starts kube-apiserver with c.apiArgs and waits until it is
// ready. The caller must not hold c.mu.
func (c *ControlPlane) runAPIServer() error {
	p, err := startProcess("kube-apiserver", filepath.Join(c.binaryDir, APIServerBinary), c.apiArgs, c.apiServerLogPath())
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.apiserver = p
	c.mu.Unlock()

	if err := c.waitAPIServerReady(p); err != nil {
		stopErr := p.stop(syscall.SIGKILL, 0)
		return errors.Join(fmt.Errorf("waiting for kube-apiserver at %s to be ready: %w\nlast lines of the kube-apiserver log:\n%s",
			c.Host(), err, logTail(c.apiServerLogPath(), logTailLines)), stopErr)
	}
	return nil
}

// waitAPIServerReady polls /readyz until it succeeds, then sets c.config,
// verifying the serving certificate with the CA written to the cert dir.
func (c *ControlPlane) waitAPIServerReady(p *process) error {
	// The serving certificate appears in the cert dir while the server
	// starts, so poll without verifying it, then switch to the CA.
	insecure := c.baseConfig()
	insecure.Insecure = true
	insecureClient, err := rest.HTTPClientFor(insecure)
	if err != nil {
		return fmt.Errorf("creating HTTP client: %w", err)
	}
	defer insecureClient.CloseIdleConnections()
	if err := poll(p, c.opts.readyTimeout, readyzProbe(insecureClient, c.Host())); err != nil {
		return err
	}

	config := c.baseConfig()
	caFile := filepath.Join(c.dir, "apiserver-certs", "apiserver.crt")
	caData, err := os.ReadFile(caFile)
	if err == nil {
		config.CAData = caData
		err = verifyReady(config, c.Host())
	}
	if err != nil {
		c.opts.logf("controlplane: cannot verify kube-apiserver's certificate with %s, skipping TLS verification (loopback only): %v", caFile, err)
		config = insecure
	}
	c.mu.Lock()
	c.config = config
	c.mu.Unlock()
	return nil
}

// baseConfig returns the admin rest.Config without TLS settings.
func (c *ControlPlane) baseConfig() *rest.Config {
	return &rest.Config{
		Host:        c.Host(),
		BearerToken: c.token,
		QPS:         50,
		Burst:       100,
		Timeout:     30 * time.Second,
	}
}

// verifyReady checks /readyz once with config.
func verifyReady(config *rest.Config, host string) error {
	client, err := rest.HTTPClientFor(config)
	if err != nil {
		return fmt.Errorf("creating HTTP client: %w", err)
	}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return readyzProbe(client, host)(ctx)
}

// readyzProbe returns a probe of host's /readyz.
func readyzProbe(client *http.Client, host string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, host+"/readyz", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			var certErr *tls.CertificateVerificationError
			if errors.As(err, &certErr) {
				return err
			}
			return fmt.Errorf("%w: %v", errNotReady, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<10))
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%w: %s: %s", errNotReady, resp.Status, failedChecks(string(body)))
		}
		return nil
	}
}

// failedChecks trims a verbose /readyz body to its failed checks.
func failedChecks(body string) string {
	var failed []string
	for line := range strings.Lines(body) {
		if strings.HasPrefix(line, "[-]") {
			failed = append(failed, strings.TrimSpace(line))
		}
	}
	if len(failed) == 0 {
		return strings.TrimSpace(body)
	}
	return strings.Join(failed, "; ")
}

// errNotReady marks a probe that did not succeed yet but may later.
var errNotReady = errors.New("not ready")

// poll runs probe until it succeeds, fails with an error not wrapping
// errNotReady, p exits or timeout passes.
func poll(p *process, timeout time.Duration, probe func(ctx context.Context) error) error {
	deadline := time.Now().Add(timeout)
	for {
		if done, err := p.exited(); done {
			return fmt.Errorf("%s exited: %v", p.name, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := probe(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if !errors.Is(err, errNotReady) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", timeout, err)
		}
		select {
		case <-p.done:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// freePorts returns n distinct free TCP ports on 127.0.0.1. They are free
// when returned; another process may take them before they are used, which
// Start handles by retrying.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free loopback port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// addrInUse reports whether the log at path says a port was taken.
func addrInUse(path string) bool {
	return strings.Contains(logTail(path, logTailLines), "address already in use")
}

// kubeconfigData returns the kubeconfig for the admin user.
func (c *ControlPlane) kubeconfigData() clientcmdapi.Config {
	config := c.RESTConfig()
	const name = "kpng-controlplane"
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{
		Server:                   config.Host,
		CertificateAuthorityData: config.CAData,
		InsecureSkipTLSVerify:    config.Insecure,
	}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: config.BearerToken}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	kc.CurrentContext = name
	return *kc
}

// RESTConfig returns a new copy of the admin rest.Config: the static admin
// token, and the CA that kube-apiserver generated in its cert dir (or no TLS
// verification if that CA did not verify, which Start reports through
// WithLogf). Callers may modify the copy.
func (c *ControlPlane) RESTConfig() *rest.Config {
	c.mu.Lock()
	defer c.mu.Unlock()
	return rest.CopyConfig(c.config)
}

// KubeconfigPath returns the path of a kubeconfig file for the admin user,
// usable with client-go's clientcmd and with --kubeconfig. It is removed by
// Stop.
func (c *ControlPlane) KubeconfigPath() string {
	return c.kubeconfig
}

// Client returns a clientset for the admin user. It keeps working across
// StopAPIServer and StartAPIServer, since the API server comes back on the
// same address with the same certificate.
func (c *ControlPlane) Client() kubernetes.Interface {
	return c.client
}

// Host returns the URL of kube-apiserver, https://127.0.0.1:<port>.
func (c *ControlPlane) Host() string {
	return "https://127.0.0.1:" + strconv.Itoa(c.apiPort)
}

// EtcdURL returns the client URL of etcd.
func (c *ControlPlane) EtcdURL() string {
	return c.etcdURL
}

// Dir returns the temporary directory that holds the control plane's
// state, credentials and logs. Stop removes it.
func (c *ControlPlane) Dir() string {
	return c.dir
}

// APIServerPID returns the process id of the running kube-apiserver, 0
// when it is stopped (its CPU time and memory are in /proc: see
// internal/proc).
func (c *ControlPlane) APIServerPID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.apiserver == nil {
		return 0
	}
	if done, _ := c.apiserver.exited(); done {
		return 0
	}
	return c.apiserver.cmd.Process.Pid
}

// APIServerLogPath returns the path of kube-apiserver's log file. Each start
// of the API server appends to it.
func (c *ControlPlane) APIServerLogPath() string {
	return c.apiServerLogPath()
}

// EtcdLogPath returns the path of etcd's log file.
func (c *ControlPlane) EtcdLogPath() string {
	return c.etcdLogPath()
}

func (c *ControlPlane) apiServerLogPath() string {
	return filepath.Join(c.dir, "kube-apiserver.log")
}

func (c *ControlPlane) etcdLogPath() string {
	return filepath.Join(c.dir, "etcd.log")
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL if it has not
// exited within 15s) and waits for it to exit. etcd keeps running with its
// data, so StartAPIServer brings the same cluster back.
func (c *ControlPlane) StopAPIServer() error {
	return c.stopAPIServer(syscall.SIGTERM)
}

// KillAPIServer kills kube-apiserver with SIGKILL, as in a crash, and waits
// for it to exit. etcd keeps running with its data, so StartAPIServer brings
// the same cluster back.
func (c *ControlPlane) KillAPIServer() error {
	return c.stopAPIServer(syscall.SIGKILL)
}

func (c *ControlPlane) stopAPIServer(sig syscall.Signal) error {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	c.mu.Lock()
	p := c.apiserver
	c.mu.Unlock()
	if p == nil {
		return errors.New("kube-apiserver is not running")
	}
	if done, _ := p.exited(); done {
		return errors.New("kube-apiserver is not running")
	}
	begin := time.Now()
	if err := p.stop(sig, stopGrace); err != nil {
		return fmt.Errorf("stopping kube-apiserver: %w", err)
	}
	c.opts.logf("controlplane: kube-apiserver stopped (%v) in %v", sig, time.Since(begin).Round(time.Millisecond))
	return nil
}

// StartAPIServer starts kube-apiserver again after StopAPIServer or
// KillAPIServer, on the same port and with the same flags, certificate and
// credentials, and waits until it is ready.
func (c *ControlPlane) StartAPIServer() error {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	c.mu.Lock()
	p, stopped := c.apiserver, c.stopped
	c.mu.Unlock()
	if stopped {
		return errors.New("starting kube-apiserver: the control plane was stopped")
	}
	if p != nil {
		if done, _ := p.exited(); !done {
			return errors.New("starting kube-apiserver: it is already running")
		}
	}
	begin := time.Now()
	if err := c.runAPIServer(); err != nil {
		return fmt.Errorf("restarting kube-apiserver: %w", err)
	}
	c.opts.logf("controlplane: kube-apiserver ready again after %v", time.Since(begin).Round(time.Millisecond))
	return nil
}

// KillEtcd kills etcd with SIGKILL, as in a crash, and waits for it to
// exit. kube-apiserver keeps running (its requests fail meanwhile), and
// StartEtcd brings etcd back with its data.
func (c *ControlPlane) KillEtcd() error {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	c.mu.Lock()
	p := c.etcd
	c.mu.Unlock()
	if p == nil {
		return errors.New("etcd is not running")
	}
	if done, _ := p.exited(); done {
		return errors.New("etcd is not running")
	}
	begin := time.Now()
	if err := p.stop(syscall.SIGKILL, 0); err != nil {
		return fmt.Errorf("killing etcd: %w", err)
	}
	c.opts.logf("controlplane: etcd killed in %v", time.Since(begin).Round(time.Millisecond))
	return nil
}

// StartEtcd starts etcd again after KillEtcd, on the same ports, with the
// same flags and data directory, and waits until it is healthy.
func (c *ControlPlane) StartEtcd() error {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	c.mu.Lock()
	p, stopped := c.etcd, c.stopped
	c.mu.Unlock()
	if stopped {
		return errors.New("starting etcd: the control plane was stopped")
	}
	if p != nil {
		if done, _ := p.exited(); !done {
			return errors.New("starting etcd: it is already running")
		}
	}
	begin := time.Now()
	if err := c.runEtcd(); err != nil {
		return fmt.Errorf("restarting etcd: %w", err)
	}
	c.opts.logf("controlplane: etcd healthy again after %v", time.Since(begin).Round(time.Millisecond))
	return nil
}

// Stop stops kube-apiserver and etcd, waits for them to exit and removes the
// control plane's directory. Calling it again does nothing.
func (c *ControlPlane) Stop() error {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	apiserver, etcd := c.apiserver, c.etcd
	c.mu.Unlock()

	var errs []error
	if apiserver != nil {
		if err := apiserver.stop(syscall.SIGTERM, stopGrace); err != nil {
			errs = append(errs, fmt.Errorf("stopping kube-apiserver: %w", err))
		}
	}
	if etcd != nil {
		if err := etcd.stop(syscall.SIGTERM, stopGrace); err != nil {
			errs = append(errs, fmt.Errorf("stopping etcd: %w", err))
		}
	}
	if len(errs) == 0 {
		if err := os.RemoveAll(c.dir); err != nil {
			errs = append(errs, fmt.Errorf("removing control plane directory: %w", err))
		}
	} else {
		errs = append(errs, fmt.Errorf("kept control plane directory %s", c.dir))
	}
	return errors.Join(errs...)
}
