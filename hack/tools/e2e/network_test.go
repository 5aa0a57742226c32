//go:build e2e

// Package e2e is Kubernetes' own network e2e suite (test/e2e/network of
// the k8s.io/kubernetes version hack/tools pins), built as a test binary
// by hack/build-controlplane.sh --with-e2e and run against the
// one-machine cluster by hack/e2e/run.sh (make e2e). Only the network
// tests are imported (they link some of the framework's other test
// packages, which the focus leaves out), so that the binary builds in a
// few minutes once the control plane's packages are in the Go build
// cache; the framework's flags are those of the upstream e2e.test, so
// that its usual command lines work.
package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"k8s.io/component-base/logs"
	"k8s.io/component-base/version"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"

	// The constants the test names use, frozen before the tests register.
	_ "k8s.io/kubernetes/test/e2e/feature"
	// The tests: sig-network's.
	_ "k8s.io/kubernetes/test/e2e/network"
	// What the upstream suite adds to every test: dumps of the namespace
	// on failure, and a check after each test that the nodes are ready.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/format"
)

// TestMain reads the framework's flags as e2e.test does, then runs
// TestNetwork.
func TestMain(m *testing.M) {
	showVersion := flag.Bool("version", false, "print the Kubernetes version the suite is built from, then exit")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Get())
		os.Exit(0)
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unexpected arguments: %q\n", flag.Args())
		os.Exit(2)
	}
	// Manifests and fixtures some tests read come from the binary itself.
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

// TestNetwork runs the selected specs through Ginkgo, with the framework's
// configuration (focus, skip, JUnit report) from the flags.
func TestNetwork(t *testing.T) {
	logs.InitLogs()
	defer logs.FlushLogs()
	klog.EnableContextualLogging(true)
	gomega.RegisterFailHandler(framework.Fail)
	suiteConfig, reporterConfig := framework.CreateGinkgoConfig()
	ginkgo.RunSpecs(t, "Kubernetes network e2e suite", suiteConfig, reporterConfig)
}
