package podcontract

import "strings"

// Expand is the kubelet's expansion of a container's env[].value, command and args,
// as the API documents it (EnvVar.value): "$(VAR_NAME)" is replaced by the variable's value
// when vars defines it and left as it is otherwise; "$$" becomes "$" ("$$(VAR_NAME)" gives
// the literal "$(VAR_NAME)"); any other "$" is kept, as is an unclosed "$(".
//
// Kubernetes' own function (k8s.io/kubernetes/third_party/forked/golang/expansion) is in
// no module of go.mod, and k8s.io/kubernetes cannot be required as a library (it needs
// every staging module at v0.0.0), so this is a reference of the documented rule, checked
// against the documented cases by TestExpand. The operator hands a warm pod's supervisor
// its job's env as the kubelet would have expanded it (podbuilder.HandoffEnv), and tests
// use it where no kubelet runs (envtest, or a process run as a container would be).
func Expand(s string, vars map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString("$(")
				i++
				continue
			}
			name := s[i+2 : i+2+end]
			if v, ok := vars[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + name + ")")
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}
