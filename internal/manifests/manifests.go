// Package manifests applies YAML manifests to an API server with typed
// clients, for the demo and the integration tests (the test control plane
// has no kubectl). Decoding is strict: a field that the kind does not have,
// or a field given twice, is an error, as kubectl's server-side field
// validation would report it.
package manifests

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
)

// strict decodes the kinds client-go knows, refusing unknown and
// duplicated fields.
var strict = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

// Decode reads every object of a multi-document YAML (or JSON) stream,
// strictly (see the package documentation).
func Decode(r io.Reader) ([]runtime.Object, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var objs []runtime.Object
	for i := 0; ; i++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read document %d: %w", i, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, _, err := strict.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("decode document %d: %w", i, err)
		}
		objs = append(objs, obj)
	}
}

func stripComments(doc []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			out = append(out, line...)
			out = append(out, '\n')
		}
	}
	return out
}

// ApplyFile creates every object of a manifest file.
func ApplyFile(ctx context.Context, c kubernetes.Interface, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open manifest: %w", err)
	}
	defer f.Close()
	objs, err := Decode(f)
	if err != nil {
		return fmt.Errorf("manifest %s: %w", path, err)
	}
	for _, obj := range objs {
		if err := Create(ctx, c, obj); err != nil {
			return fmt.Errorf("manifest %s: %w", path, err)
		}
	}
	return nil
}

// Create creates one object of the kinds the examples use.
func Create(ctx context.Context, c kubernetes.Interface, obj runtime.Object) error {
	return CreateWith(ctx, c, obj, metav1.CreateOptions{})
}

// CreateWith is Create with options: for example a server-side dry run
// with strict field validation (DryRun: []string{metav1.DryRunAll},
// FieldValidation: "Strict").
func CreateWith(ctx context.Context, c kubernetes.Interface, obj runtime.Object, opts metav1.CreateOptions) error {
	var err error
	switch o := obj.(type) {
	case *v1.Namespace:
		_, err = c.CoreV1().Namespaces().Create(ctx, o, opts)
	case *v1.Node:
		_, err = c.CoreV1().Nodes().Create(ctx, o, opts)
	case *v1.Service:
		_, err = c.CoreV1().Services(ns(o.Namespace)).Create(ctx, o, opts)
	case *discovery.EndpointSlice:
		_, err = c.DiscoveryV1().EndpointSlices(ns(o.Namespace)).Create(ctx, o, opts)
	case *appsv1.Deployment:
		_, err = c.AppsV1().Deployments(ns(o.Namespace)).Create(ctx, o, opts)
	case *appsv1.DaemonSet:
		_, err = c.AppsV1().DaemonSets(ns(o.Namespace)).Create(ctx, o, opts)
	case *v1.ServiceAccount:
		_, err = c.CoreV1().ServiceAccounts(ns(o.Namespace)).Create(ctx, o, opts)
	case *rbacv1.ClusterRole:
		_, err = c.RbacV1().ClusterRoles().Create(ctx, o, opts)
	case *rbacv1.ClusterRoleBinding:
		_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, opts)
	default:
		return fmt.Errorf("create %T: kind not supported", obj)
	}
	if err != nil {
		m, _ := obj.(metav1.Object)
		name := ""
		if m != nil {
			name = m.GetNamespace() + "/" + m.GetName()
		}
		return fmt.Errorf("create %T %s: %w", obj, name, err)
	}
	return nil
}

func ns(n string) string {
	if n == "" {
		return metav1.NamespaceDefault
	}
	return n
}
