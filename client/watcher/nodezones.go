package watcher

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// WatchNodeZones calls set with each node's zone label (empty when the
// node has none or is deleted) when it is first seen and whenever it
// changes, until ctx ends. A controller serving backends on many nodes uses
// it to match topology hints for each of them.
func WatchNodeZones(ctx context.Context, client kubernetes.Interface, set func(node, zone string)) error {
	infs := &informers{client: client}
	inf := infs.nodes(nil, func(obj any) (any, error) {
		// Only the name and labels are needed.
		if n, ok := obj.(*v1.Node); ok {
			return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels, ResourceVersion: n.ResourceVersion}}, nil
		}
		return obj, nil
	})
	zones := map[string]string{} // only touched by the informer's handler goroutine
	update := func(obj any, deleted bool) {
		n, ok := obj.(*v1.Node)
		if !ok {
			return
		}
		zone := n.Labels[zoneLabel]
		if deleted {
			zone = ""
			defer delete(zones, n.Name)
		}
		if old, seen := zones[n.Name]; seen && old == zone {
			return
		}
		zones[n.Name] = zone
		klog.V(4).InfoS("Node zone", "node", n.Name, "zone", zone)
		set(n.Name, zone)
	}
	if _, err := inf.AddEventHandler(handlers(update)); err != nil {
		return fmt.Errorf("watch nodes: %w", err)
	}
	infs.start(ctx)
	<-ctx.Done()
	infs.wait()
	return nil
}
