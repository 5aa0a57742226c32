package client

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	corev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	discoveryv1 "k8s.io/client-go/kubernetes/typed/discovery/v1"
	"k8s.io/client-go/rest"
)

// watchClient is the part of a clientset the watcher uses: the core/v1
// (services, nodes) and discovery/v1 (EndpointSlices) clients. Run builds
// it instead of kubernetes.NewForConfig, whose clientset holds the client
// of every API group and, with it, the code of all of them (5 MB of
// kpng-json without -tags grpcnotrace: docs/operating.md, "Image"). The
// other groups' methods are the nil embedded Interface's: calling one
// panics, and the watcher calls none (the integration tests of Run
// would).
type watchClient struct {
	kubernetes.Interface
	core      corev1.CoreV1Interface
	discovery discoveryv1.DiscoveryV1Interface
}

// CoreV1 returns the core/v1 client.
func (c *watchClient) CoreV1() corev1.CoreV1Interface { return c.core }

// DiscoveryV1 returns the discovery/v1 client.
func (c *watchClient) DiscoveryV1() discoveryv1.DiscoveryV1Interface { return c.discovery }

// newWatchClient returns the watcher's client for cfg: both groups share
// one HTTP client, as a clientset's do.
func newWatchClient(cfg *rest.Config) (kubernetes.Interface, error) {
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("http client: %w", err)
	}
	core, err := corev1.NewForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("core/v1 client: %w", err)
	}
	discovery, err := discoveryv1.NewForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("discovery/v1 client: %w", err)
	}
	return &watchClient{core: core, discovery: discovery}, nil
}
