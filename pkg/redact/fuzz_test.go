package redact

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// FuzzRedactStream checks, for any secrets, input and cut points, that streaming gives the
// one-shot result, that the one-shot result is the reference's (every occurrence replaced,
// overlaps merged), and that the Writer never holds back more than MaxHold bytes. The seed
// corpus is in testdata/fuzz/FuzzRedactStream.
func FuzzRedactStream(f *testing.F) {
	f.Add("s3cr3t-value", "other-secret", []byte("token=s3cr3t-value and other-secret\n"), uint64(1))
	f.Add("abcdef", "defghi", []byte("-abcdefghi-abcdefabcdef"), uint64(2))
	f.Add("aaaaaa", "", []byte("baaaaaaaaaaaaab"), uint64(3))
	f.Add("line one\nline two", "x\"y\\z-quoted", []byte("line one\r\nline two / x\\\"y\\\\z-quoted"), uint64(4))
	f.Fuzz(func(t *testing.T, s1, s2 string, in []byte, seed uint64) {
		r := New(s1, s2)
		oneShot := r.String(string(in))
		if want := reference(r, in); oneShot != want {
			t.Fatalf("one shot %q, reference %q", oneShot, want)
		}
		rng := rand.New(rand.NewPCG(seed, seed>>1))
		cuts := make([]int, rng.IntN(8))
		for i := range cuts {
			cuts[i] = rng.IntN(len(in) + 1)
		}
		slices.Sort(cuts)
		if got := streamed(t, r, in, cuts); got != oneShot {
			t.Fatalf("cut at %v: %q, one shot %q", cuts, got, oneShot)
		}
	})
}

// FuzzValues feeds BUILDKITE_REDACTED_VARS and variable names from outside: no panic, and
// every value returned belongs to a variable whose name matches a pattern.
func FuzzValues(f *testing.F) {
	f.Add("*_TOKEN,*_PASSWORD", "GITHUB_TOKEN", "ghp_0123456789")
	f.Add("[", "A_TOKEN", "value-long-enough")
	f.Add(" , ,*", "x", "short")
	f.Fuzz(func(t *testing.T, patterns, name, value string) {
		if strings.ContainsAny(name, "=\x00") {
			return // not a variable name
		}
		pats := PatternsFromEnv([]string{EnvRedactedVars + "=" + patterns})
		values, short, _ := Values(pats, []string{name + "=" + value})
		if len(values)+len(short) > 1 {
			t.Fatalf("one variable gave values %q and short %q", values, short)
		}
		if len(values) == 1 && (values[0] != value || len(value) < MinLength || !matchAny(pats, name)) {
			t.Fatalf("value %q returned for %s=%q with patterns %q", values[0], name, value, pats)
		}
		if len(short) == 1 && len(value) >= MinLength {
			t.Fatalf("%s=%q reported short", name, value)
		}
	})
}
