package localsink

import (
	"reflect"

	"sigs.k8s.io/kpng/model"
)

// EndpointChanges compares the endpoints of two values of one service, as
// an Update gives them (either may be nil; endpoints sorted by address):
// removed are the endpoints of prev whose address cur lacks, set those of
// cur that are new or changed, both in address order. An endpoint is
// identified by its address (model.Endpoint.Key).
func EndpointChanges(prev, cur *model.ServiceEndpoints) (removed, set []*model.Endpoint) {
	var old, now []*model.Endpoint
	if prev != nil {
		old = prev.Endpoints
	}
	if cur != nil {
		now = cur.Endpoints
	}
	i, j := 0, 0
	for i < len(old) || j < len(now) {
		c := 0
		switch {
		case i == len(old):
			c = 1
		case j == len(now):
			c = -1
		default:
			c = model.CompareEndpoints(old[i], now[j])
		}
		switch {
		case c < 0:
			removed = append(removed, old[i])
			i++
		case c > 0:
			set = append(set, now[j])
			j++
		default:
			if old[i] != now[j] && !reflect.DeepEqual(old[i], now[j]) {
				set = append(set, now[j])
			}
			i++
			j++
		}
	}
	return removed, set
}

// countEndpointChanges returns the number of endpoints added, changed or
// removed between prev and cur (EndpointChanges without its slices).
func countEndpointChanges(prev, cur *model.ServiceEndpoints) int {
	var old, now []*model.Endpoint
	if prev != nil {
		old = prev.Endpoints
	}
	if cur != nil {
		now = cur.Endpoints
	}
	n, i, j := 0, 0, 0
	for i < len(old) && j < len(now) {
		switch c := model.CompareEndpoints(old[i], now[j]); {
		case c < 0:
			n++
			i++
		case c > 0:
			n++
			j++
		default:
			if old[i] != now[j] && !reflect.DeepEqual(old[i], now[j]) {
				n++
			}
			i++
			j++
		}
	}
	return n + len(old) - i + len(now) - j
}
