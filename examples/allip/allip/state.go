package allip

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"sigs.k8s.io/kpng/model"
)

// ReadState decodes a state as kpng-json prints it: zero or more JSON
// objects, one per service, one after the other (one per line or not). A
// JSON array of such objects is accepted too, in place of any object. The
// error locates the first value that is not valid.
func ReadState(r io.Reader) ([]*model.ServiceEndpoints, error) {
	dec := json.NewDecoder(r)
	var items []*model.ServiceEndpoints
	for n := 1; ; n++ {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return items, nil
			}
			return nil, fmt.Errorf("state: JSON value %d (near byte %d): %w", n, dec.InputOffset(), err)
		}
		switch t := bytes.TrimSpace(raw); {
		case len(t) > 0 && t[0] == '{':
			var it model.ServiceEndpoints
			if err := json.Unmarshal(t, &it); err != nil {
				return nil, fmt.Errorf("state: JSON value %d: %w", n, err)
			}
			items = append(items, &it)
		case len(t) > 0 && t[0] == '[':
			var list []*model.ServiceEndpoints
			if err := json.Unmarshal(t, &list); err != nil {
				return nil, fmt.Errorf("state: JSON value %d: %w", n, err)
			}
			items = append(items, list...)
		default:
			return nil, fmt.Errorf("state: JSON value %d is %.20s, want an object (one service) or an array of them", n, t)
		}
	}
}
