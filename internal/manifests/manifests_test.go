package manifests

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
)

func TestDecodeIsStrict(t *testing.T) {
	const sa = "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: a\n  namespace: kube-system\n"
	for _, tc := range []struct {
		name, doc, wantErr string
	}{
		{"valid", sa, ""},
		{"comments and empty documents", "# x\n---\n" + sa + "---\n# only a comment\n", ""},
		{"unknown field", sa + "automountServiceAccountToken: false\nbogus: 1\n", `unknown field "bogus"`},
		{"misplaced field", "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: d\nspec:\n  template:\n    spec:\n      hostNetwork: true\n      containers:\n      - name: c\n        image: i\n        hostNetwork: true\n",
			`unknown field "spec.template.spec.containers[0].hostNetwork"`},
		{"duplicate field", sa + "metadata:\n  name: b\n", `key "metadata" already set`},
		{"unknown kind", "apiVersion: v1\nkind: Bogus\nmetadata:\n  name: a\n", "no kind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := Decode(strings.NewReader(tc.doc))
			if tc.wantErr == "" {
				if err != nil || len(objs) != 1 {
					t.Fatalf("Decode = %d objects, %v; want 1, nil", len(objs), err)
				}
				if _, ok := objs[0].(*v1.ServiceAccount); !ok {
					t.Errorf("decoded %T, want *v1.ServiceAccount", objs[0])
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Decode error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
	// A valid DaemonSet decodes to its type.
	objs, err := Decode(strings.NewReader("apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: d\n"))
	if err != nil || len(objs) != 1 {
		t.Fatalf("Decode DaemonSet = %v, %v", objs, err)
	}
	if _, ok := objs[0].(*appsv1.DaemonSet); !ok {
		t.Errorf("decoded %T, want *appsv1.DaemonSet", objs[0])
	}
}
