package localsink

import "sigs.k8s.io/kpng/client/model"

// Tee returns a Sink that forwards every call to each of sinks, in order:
// several backends fed by one source (rules and a health server, say).
func Tee(sinks ...Sink) Sink { return tee(sinks) }

type tee []Sink

func (t tee) Reset() {
	for _, s := range t {
		s.Reset()
	}
}

func (t tee) SetService(svc *model.Service) {
	for _, s := range t {
		s.SetService(svc)
	}
}

func (t tee) DeleteService(key model.ServiceKey) {
	for _, s := range t {
		s.DeleteService(key)
	}
}

func (t tee) SetEndpoint(svc model.ServiceKey, key string, ep *model.Endpoint) {
	for _, s := range t {
		s.SetEndpoint(svc, key, ep)
	}
}

func (t tee) DeleteEndpoint(svc model.ServiceKey, key string) {
	for _, s := range t {
		s.DeleteEndpoint(svc, key)
	}
}

func (t tee) Sync() {
	for _, s := range t {
		s.Sync()
	}
}
