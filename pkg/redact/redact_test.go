package redact

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPatternsFromEnv(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		want []string
	}{
		{name: "unset: the agent's defaults", env: []string{"PATH=/bin"}, want: DefaultPatterns},
		{name: "set: replaces the defaults, split at commas, trimmed", env: []string{EnvRedactedVars + "=*_PASS, MY_*,,"}, want: []string{"*_PASS", "MY_*"}},
		{name: "set but empty: nothing", env: []string{EnvRedactedVars + "="}, want: nil},
		{name: "the last setting wins", env: []string{EnvRedactedVars + "=A", EnvRedactedVars + "=B"}, want: []string{"B"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, PatternsFromEnv(tt.env))
		})
	}
}

func TestValues(t *testing.T) {
	env := []string{
		"DB_PASSWORD=hunter2hunter2",
		"GITHUB_TOKEN=ghp_abcdefghij",
		"github_token=lowercase-not-matched", // the agent's path.Match is case-sensitive
		"API_TOKEN=none",                     // too short
		"EMPTY_SECRET=",                      // empty: not even reported
		"BUILDKITE_AGENT_ACCESS_TOKEN=bkaj_job-token-value",
		"AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG",
		"STRIPE_API_KEY=sk_live_123456",
		"PG_CONNECTION_STRING=postgres://u:p@h/db",
		"DEPLOY_SSH_KEY=-----BEGIN KEY-----",
		"PLAIN=hunter2hunter2", // same value as DB_PASSWORD, not matched by name
		"OTHER_PASSWORD=hunter2hunter2",
		"REPLACED_TOKEN=first-value-1",
		"REPLACED_TOKEN=second-value-2", // only the last setting is the job's
	}
	values, short, err := Values(DefaultPatterns, env)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{
		"hunter2hunter2", "ghp_abcdefghij", "bkaj_job-token-value", "wJalrXUtnFEMI/K7MDENG",
		"sk_live_123456", "postgres://u:p@h/db", "-----BEGIN KEY-----", "second-value-2",
	}, values, "each value once")
	assert.Equal(t, []string{"API_TOKEN"}, short)

	_, _, err = Values([]string{"[", "*_TOKEN"}, env)
	require.ErrorContains(t, err, `"["`, "a bad glob is named")
}

func TestRedact(t *testing.T) {
	tests := []struct {
		name    string
		secrets []string
		in      string
		want    string
	}{
		{name: "nothing to redact", in: "hello\n", want: "hello\n"},
		{name: "one secret", secrets: []string{"s3cr3t-value"}, in: "token=s3cr3t-value\n", want: "token=[REDACTED]\n"},
		{name: "twice, and at both ends", secrets: []string{"s3cr3t"}, in: "s3cr3t and s3cr3t", want: "[REDACTED] and [REDACTED]"},
		{name: "short secrets are not redacted", secrets: []string{"none"}, in: "none\n", want: "none\n"},
		{name: "surrounding white space is trimmed", secrets: []string{"  padded-secret\n"}, in: "x padded-secret y", want: "x [REDACTED] y"},
		{name: "overlapping secrets: one [REDACTED] for the whole stretch", secrets: []string{"abcdef", "defghi"}, in: "-abcdefghi-", want: "-[REDACTED]-"},
		{name: "a secret repeated over itself", secrets: []string{"aaaaaa"}, in: "baaaaaaaaab", want: "b[REDACTED]b"},
		{name: "touching occurrences: one each", secrets: []string{"abcdef"}, in: "abcdefabcdef", want: "[REDACTED][REDACTED]"},
		{name: "one secret inside another", secrets: []string{"xxsecretxx", "secret"}, in: "a xxsecretxx b secret", want: "a [REDACTED] b [REDACTED]"},
		{name: "an almost-secret stays", secrets: []string{"password1"}, in: "password2 password", want: "password2 password"},
		{name: "quoted form (%q)", secrets: []string{`pa"ss\word`}, in: `"pa\"ss\\word"`, want: `"[REDACTED]"`},
		{
			name: "a value of several lines, with LF or CRLF", secrets: []string{"-----BEGIN-----\nabcdef\n-----END-----"},
			in:   "k=-----BEGIN-----\nabcdef\n-----END-----\nt=-----BEGIN-----\r\nabcdef\r\n-----END-----\r\nq=-----BEGIN-----\\nabcdef\\n-----END-----",
			want: "k=[REDACTED]\nt=[REDACTED]\r\nq=[REDACTED]",
		},
		{name: "bytes that are not text", secrets: []string{"\x00\xff\x01secret"}, in: "\x00\x00\xff\x01secret\xff", want: "\x00[REDACTED]\xff"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := New(tt.secrets...)
			assert.Equal(t, tt.want, r.String(tt.in), "one shot")
			// Every way of cutting the input in two gives the same output.
			for cut := 0; cut <= len(tt.in); cut++ {
				assert.Equal(t, tt.want, streamed(t, r, []byte(tt.in), []int{cut}), "cut at %d", cut)
			}
			// And byte by byte.
			var cuts []int
			for i := range len(tt.in) {
				cuts = append(cuts, i)
			}
			assert.Equal(t, tt.want, streamed(t, r, []byte(tt.in), cuts), "byte by byte")
		})
	}
}

// TestHoldsBackOnlyWhatCouldStartASecret checks what a Writer writes before the stream ends:
// everything except a tail that is the start of a secret, never more than MaxHold bytes.
func TestHoldsBackOnlyWhatCouldStartASecret(t *testing.T) {
	r := New("0123456789abcdef", "ghost-token")
	tests := []struct {
		in        string
		written   string
		heldBytes int
	}{
		{in: "plain output\n", written: "plain output\n"},
		{in: "ends with the start: 0123", written: "ends with the start: ", heldBytes: 4},
		{in: "ends with almost all: 0123456789abcde", written: "ends with almost all: ", heldBytes: 15},
		{in: "g", written: "", heldBytes: 1},
		{in: "a whole one 0123456789abcdef!", written: "a whole one [REDACTED]!"},
		{in: "aaaa0123456789abcdef0123", written: "aaaa[REDACTED]", heldBytes: 4},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			var out bytes.Buffer
			w := r.NewWriter(&out)
			_, err := w.Write([]byte(tt.in))
			require.NoError(t, err)
			assert.Equal(t, tt.written, out.String())
			assert.Equal(t, tt.heldBytes, w.Held())
			assert.LessOrEqual(t, w.Held(), r.MaxHold())
			require.NoError(t, w.Flush())
			assert.Equal(t, r.String(tt.in), out.String(), "the rest comes out at Flush")
			assert.Zero(t, w.Held())
		})
	}
}

// TestRepeatingInputStaysBounded writes a secret that overlaps itself for ever: the whole
// stretch is one [REDACTED], and the Writer still holds back less than the secret's length.
func TestRepeatingInputStaysBounded(t *testing.T) {
	r := New("abababab")
	var out bytes.Buffer
	w := r.NewWriter(&out)
	_, err := w.Write([]byte("start "))
	require.NoError(t, err)
	for range 10_000 {
		_, err := w.Write([]byte("abababababababab"))
		require.NoError(t, err)
		require.LessOrEqual(t, w.Held(), r.MaxHold())
	}
	_, err = w.Write([]byte(" end"))
	require.NoError(t, err)
	require.NoError(t, w.Flush())
	assert.Equal(t, "start [REDACTED] end", out.String())
}

func TestWriteErrorIsReturned(t *testing.T) {
	boom := errors.New("boom")
	w := New("secret-value").NewWriter(failingWriter{boom})
	_, err := w.Write([]byte("some output"))
	assert.ErrorIs(t, err, boom)
}

type failingWriter struct{ err error }

func (f failingWriter) Write([]byte) (int, error) { return 0, f.err }

// streamed writes in to a Writer cut at cuts (sorted offsets), flushes, and returns what came
// out, checking the hold-back bound after every write.
func streamed(t testing.TB, r *Redactor, in []byte, cuts []int) string {
	t.Helper()
	var out bytes.Buffer
	w := r.NewWriter(&out)
	prev := 0
	for _, c := range append(cuts, len(in)) {
		c = min(max(c, prev), len(in))
		n, err := w.Write(in[prev:c])
		if err != nil || n != c-prev {
			t.Fatalf("write: %d, %v", n, err)
		}
		if w.Held() > r.MaxHold() {
			t.Fatalf("holding %d bytes, more than MaxHold %d", w.Held(), r.MaxHold())
		}
		prev = c
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// reference is the plain statement of what redaction does: every occurrence of every needle
// found, overlapping ones merged, each merged stretch replaced once.
func reference(r *Redactor, in []byte) string {
	type span struct{ from, to int }
	var spans []span
	for i := range in {
		for _, n := range r.needles {
			if bytes.HasPrefix(in[i:], n) {
				if k := len(spans) - 1; k >= 0 && i < spans[k].to {
					spans[k].to = max(spans[k].to, i+len(n))
				} else {
					spans = append(spans, span{i, i + len(n)})
				}
			}
		}
	}
	var b strings.Builder
	prev := 0
	for _, s := range spans {
		b.Write(in[prev:s.from])
		b.WriteString(Replacement)
		prev = s.to
	}
	b.Write(in[prev:])
	return b.String()
}

// TestAgainstReference compares with the plain statement on random input made of a small
// alphabet, where secrets occur, overlap and almost occur often.
func TestAgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	word := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = "ab\n"[rng.IntN(3)]
		}
		return string(b)
	}
	for range 3000 {
		var secrets []string
		for range 1 + rng.IntN(4) {
			secrets = append(secrets, word(MinLength+rng.IntN(6)))
		}
		r := New(secrets...)
		in := []byte(word(rng.IntN(200)))
		want := reference(r, in)
		require.Equal(t, want, r.String(string(in)), "secrets %q input %q", secrets, in)
		cuts := []int{rng.IntN(len(in) + 1), rng.IntN(len(in) + 1), rng.IntN(len(in) + 1)}
		slices.Sort(cuts)
		require.Equal(t, want, streamed(t, r, in, cuts), "secrets %q input %q cuts %v", secrets, in, cuts)
	}
}

// TestStride checks the scan's stride, which grows with the shortest secret and shrinks
// with the number of needles, and that at that stride every secret is found wherever it
// starts: at each offset from the start of a write, and across two writes.
func TestStride(t *testing.T) {
	many := make([]string, 400)
	for i := range many {
		many[i] = fmt.Sprintf("many-secret-%04d-long-enough", i)
	}
	tests := []struct {
		name    string
		secrets []string
		want    int
	}{
		{name: "none", want: 0},
		{name: "the shortest secret there is: every third position", secrets: []string{"abcdef"}, want: 3},
		{name: "the shortest decides", secrets: []string{"abcdefgh", strings.Repeat("x", 40)}, want: 5},
		{name: "a token of 20 bytes", secrets: []string{"AKIAIOSFODNN7EXAMPLE"}, want: 16},
		{name: "long secrets: capped", secrets: []string{strings.Repeat("y", 64)}, want: maxStride},
		{name: "quoted forms count as needles: a short one decides", secrets: []string{"line one\nline two"}, want: 14},
		{name: "hundreds of needles: shorter, to keep the filter sparse", secrets: many, want: maxFilterFill / 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := New(tt.secrets...)
			require.Equal(t, tt.want, r.stride)
			for _, s := range tt.secrets[:min(len(tt.secrets), 3)] {
				for at := range 2*maxStride + 1 {
					in := []byte(strings.Repeat(".", at) + s + strings.Repeat(".", at%7))
					want := reference(r, in)
					require.Contains(t, want, Replacement, "%q at %d", s, at)
					require.Equal(t, want, r.String(string(in)), "%q at %d", s, at)
					require.Equal(t, want, streamed(t, r, in, []int{at + len(s)/2}), "%q at %d, cut in the middle", s, at)
				}
			}
		})
	}
}

// TestAgainstReferenceLongSecrets is TestAgainstReference with secrets of up to 40 bytes,
// so that the scan's stride goes up to its largest.
func TestAgainstReferenceLongSecrets(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	word := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = "ab\n"[rng.IntN(3)]
		}
		return string(b)
	}
	strides := map[int]bool{}
	for range 3000 {
		var secrets []string
		shortest := 6 + rng.IntN(30)
		for range 1 + rng.IntN(3) {
			secrets = append(secrets, word(shortest+rng.IntN(10)))
		}
		r := New(secrets...)
		strides[r.stride] = true
		// Long input made of the secrets themselves, cut up and joined, so that they occur,
		// overlap and almost occur often.
		var b strings.Builder
		for b.Len() < 100+rng.IntN(500) {
			s := secrets[rng.IntN(len(secrets))]
			from := rng.IntN(len(s))
			b.WriteString(s[from:][:rng.IntN(len(s)-from)+1])
			b.WriteString(word(rng.IntN(4)))
		}
		in := []byte(b.String())
		want := reference(r, in)
		require.Equal(t, want, r.String(string(in)), "secrets %q input %q", secrets, in)
		cuts := []int{rng.IntN(len(in) + 1), rng.IntN(len(in) + 1), rng.IntN(len(in) + 1)}
		slices.Sort(cuts)
		require.Equal(t, want, streamed(t, r, in, cuts), "secrets %q input %q cuts %v", secrets, in, cuts)
	}
	for st := minStride; st <= maxStride; st++ {
		assert.True(t, strides[st], "no case had stride %d", st)
	}
}
