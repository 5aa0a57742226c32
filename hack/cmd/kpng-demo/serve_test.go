package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"sigs.k8s.io/kpng/internal/controlplane"
)

// TestServe runs `kpng-demo --serve` as a program (a real control plane):
// it reads the printed kubeconfig, finds the blog's Service through it,
// then stops the program with SIGTERM and checks that it exits 0 and
// removes the control plane's data, kubeconfig included.
func TestServe(t *testing.T) {
	controlplane.SkipIfShort(t)
	bin := filepath.Join(t.TempDir(), "kpng-demo")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "--serve")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() { _ = cmd.Process.Kill() }) // after a failure; done is fine

	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
	}()
	var kubeconfig string
	var printed []string
	timeout := time.After(3 * time.Minute)
	for kubeconfig == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("kpng-demo --serve ended before printing a kubeconfig: %v\nstdout:\n%s\nstderr:\n%s", <-exited, strings.Join(printed, "\n"), stderr.String())
			}
			printed = append(printed, l)
			if k, ok := strings.CutPrefix(l, "export KUBECONFIG="); ok {
				kubeconfig = k
			}
		case <-timeout:
			t.Fatalf("no export KUBECONFIG= line within 3 minutes; stdout:\n%s", strings.Join(printed, "\n"))
		}
	}
	rest := make(chan []string, 1)
	go func() {
		var more []string
		for l := range lines {
			more = append(more, l)
		}
		rest <- more
	}()

	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatalf("the printed kubeconfig %s: %v", kubeconfig, err)
	}
	cs, err := kubernetes.NewForConfig(config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svcs, err := cs.CoreV1().Services("default").List(ctx, metav1.ListOptions{LabelSelector: "service.kubernetes.io/service-proxy-name=" + serviceProxyName})
	if err != nil {
		t.Fatalf("listing the services through the printed kubeconfig: %v", err)
	}
	if len(svcs.Items) != 1 || svcs.Items[0].Name != "kpng-example" {
		t.Errorf("services of proxy name %s: %v, want kpng-example", serviceProxyName, svcs.Items)
	}
	if _, err := cs.CoreV1().Nodes().Get(ctx, localNode, metav1.GetOptions{}); err != nil {
		t.Errorf("node %s: %v", localNode, err)
	}
	if !strings.Contains(strings.Join(printed, "\n"), "service-proxy-name "+serviceProxyName) {
		t.Errorf("the service-proxy-name is not printed:\n%s", strings.Join(printed, "\n"))
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("kpng-demo --serve after SIGTERM: %v\n%s", err, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("kpng-demo --serve still running a minute after SIGTERM")
	}
	if more := <-rest; !strings.Contains(strings.Join(more, "\n"), "Stopping the control plane") {
		t.Errorf("no cleanup reported after SIGTERM: %q", more)
	}
	if _, err := os.Stat(kubeconfig); !os.IsNotExist(err) {
		t.Errorf("the kubeconfig %s is still there after the stop (err %v): the control plane's data was not removed", kubeconfig, err)
	}
}
