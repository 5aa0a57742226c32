package model

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The names of a service and its endpoints are checked as the API server
// checks them (the rules of k8s.io/apimachinery's validation, written here
// so that the model needs no Kubernetes package). Inputs that Kubernetes
// does not check (a state file, another controller's gRPC stream) check
// them with CheckNames, since names reach rule text, comments and logs.

// MaxQuoted is the most bytes of a value from outside that Quote keeps:
// the longest name Kubernetes accepts (a DNS-1123 subdomain).
const MaxQuoted = 253

// Quote returns s quoted as Go quotes a string (strconv.Quote: a newline,
// NUL, quote or invalid byte is written as an escape, so that the text
// stays one line of a log or message), cut to its first MaxQuoted bytes
// on a character boundary, followed by its length when it is cut:
// "\"aaa…\"…(70000 bytes)".
func Quote(s string) string {
	if len(s) <= MaxQuoted {
		return strconv.Quote(s)
	}
	cut := MaxQuoted
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + fmt.Sprintf("…(%d bytes)", len(s))
}

// LogValue returns s as a value to log with klog: s itself when it is at
// most MaxQuoted bytes of printable UTF-8 on one line (klog quotes such a
// string), else Quote(s), one line and bounded. klog writes a string
// holding a newline as several lines, and in full: a name from outside
// (a node name a gRPC client sends) would otherwise make a log record as
// large as the name, or look like several records.
func LogValue(s string) string {
	if len(s) <= MaxQuoted && utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0 {
		return s
	}
	return Quote(s)
}

// CheckNames checks the names of se as the API server would: the
// service's namespace (a DNS-1123 label) and name (a DNS-1035 label), its
// ports' names (DNS-1123 labels) and named target ports (IANA service
// names), and for each endpoint its node name and hinted nodes (DNS-1123
// subdomains) and the port names of its overrides. The first bad one is
// returned as a *Problem (ReasonBadField) naming the service and the
// field, its value quoted (Quote); nil when all are good. A nil Service
// is left to the caller.
func (se *ServiceEndpoints) CheckNames() error {
	if se == nil || se.Service == nil {
		return nil
	}
	if err := se.Service.CheckNames(); err != nil {
		return err
	}
	key := se.Service.Key()
	for i, ep := range se.Endpoints {
		if err := ep.CheckNames(key, fmt.Sprintf("endpoints[%d]", i)); err != nil {
			return err
		}
	}
	return nil
}

// CheckNames checks the names of s (see ServiceEndpoints.CheckNames).
func (s *Service) CheckNames() error {
	key := s.Key()
	if why := dns1123Label(s.Namespace); why != "" {
		return badName(key, "metadata.namespace", s.Namespace, "a DNS-1123 label", why)
	}
	if why := dns1035Label(s.Name); why != "" {
		return badName(key, "metadata.name", s.Name, "a DNS-1035 label", why)
	}
	for i, p := range s.Ports {
		if p == nil {
			continue
		}
		if p.Name != "" {
			if why := dns1123Label(p.Name); why != "" {
				return badName(key, fmt.Sprintf("spec.ports[%d].name", i), p.Name, "a DNS-1123 label", why)
			}
		}
		if p.TargetPortName != "" {
			if why := ianaServiceName(p.TargetPortName); why != "" {
				return badName(key, fmt.Sprintf("spec.ports[%d].targetPort", i), p.TargetPortName, "an IANA service name", why)
			}
		}
	}
	return nil
}

// CheckNames checks the names of e, an endpoint of service key that
// field names ("endpoints[3]"): see ServiceEndpoints.CheckNames.
func (e *Endpoint) CheckNames(key ServiceKey, field string) error {
	if e == nil {
		return nil
	}
	if e.NodeName != "" {
		if why := dns1123Subdomain(e.NodeName); why != "" {
			return badName(key, field+".nodeName", e.NodeName, "a DNS-1123 subdomain", why)
		}
	}
	if e.Hints != nil {
		for i, n := range e.Hints.Nodes {
			if why := dns1123Subdomain(n); why != "" {
				return badName(key, fmt.Sprintf("%s.hints.forNodes[%d]", field, i), n, "a DNS-1123 subdomain", why)
			}
		}
	}
	for name := range e.PortOverrides {
		if name == "" {
			continue
		}
		if why := dns1123Label(name); why != "" {
			return badName(key, field+".ports[].name", name, "a DNS-1123 label", why)
		}
	}
	return nil
}

// badName is the Problem of a name that is not what it must be.
func badName(key ServiceKey, field, value, must, why string) *Problem {
	// The key itself may be the bad name: quote it too.
	return NewProblem(key, field, ReasonBadField, "service %s/%s: %s: %s is not %s: %s",
		Quote(key.Namespace), Quote(key.Name), field, Quote(value), must, why)
}

const (
	maxLabel     = 63
	maxSubdomain = 253
	maxIANA      = 15
)

func isLower(c byte) bool { return c >= 'a' && c <= 'z' }
func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// dns1123Label says what makes s not a DNS-1123 label (at most 63
// characters: lower-case letters, digits and "-", starting and ending
// with a letter or digit); "" when it is one.
func dns1123Label(s string) string {
	switch {
	case s == "":
		return "empty"
	case len(s) > maxLabel:
		return fmt.Sprintf("%d characters, more than %d", len(s), maxLabel)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isLower(c) && !isDigit(c) && c != '-' {
			return "only lower-case letters, digits and '-' are allowed"
		}
	}
	if s[0] == '-' || s[len(s)-1] == '-' {
		return "it must start and end with a letter or digit"
	}
	return ""
}

// dns1035Label says what makes s not a DNS-1035 label (a DNS-1123 label
// starting with a letter); "" when it is one.
func dns1035Label(s string) string {
	if why := dns1123Label(s); why != "" {
		return why
	}
	if !isLower(s[0]) {
		return "it must start with a lower-case letter"
	}
	return ""
}

// dns1123Subdomain says what makes s not a DNS-1123 subdomain (at most
// 253 characters: DNS-1123 labels joined by "."); "" when it is one.
func dns1123Subdomain(s string) string {
	switch {
	case s == "":
		return "empty"
	case len(s) > maxSubdomain:
		return fmt.Sprintf("%d characters, more than %d", len(s), maxSubdomain)
	}
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] != '.' {
			continue
		}
		label := s[start:i]
		if label == "" {
			return "an empty part between dots"
		}
		for j := 0; j < len(label); j++ {
			if c := label[j]; !isLower(c) && !isDigit(c) && c != '-' {
				return "only lower-case letters, digits, '-' and '.' are allowed"
			}
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return "each part must start and end with a letter or digit"
		}
		start = i + 1
	}
	return ""
}

// ianaServiceName says what makes s not an IANA service name (at most 15
// characters: lower-case letters, digits and "-", at least one letter, no
// "-" at either end nor two in a row); "" when it is one.
func ianaServiceName(s string) string {
	switch {
	case s == "":
		return "empty"
	case len(s) > maxIANA:
		return fmt.Sprintf("%d characters, more than %d", len(s), maxIANA)
	}
	letter := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case isLower(c):
			letter = true
		case isDigit(c):
		case c == '-':
			if i > 0 && s[i-1] == '-' {
				return "'-' must not follow '-'"
			}
		default:
			return "only lower-case letters, digits and '-' are allowed"
		}
	}
	if !letter {
		return "it must hold a letter"
	}
	if s[0] == '-' || s[len(s)-1] == '-' {
		return "it must start and end with a letter or digit"
	}
	return ""
}
