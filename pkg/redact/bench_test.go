package redact

import (
	"fmt"
	"io"
	"math/rand/v2"
	"testing"
)

// benchSecrets are a dozen secrets of the lengths jobs have: tokens, passwords, keys.
func benchSecrets() []string {
	rng := rand.New(rand.NewPCG(3, 4))
	var out []string
	for i := range 12 {
		b := make([]byte, 12+rng.IntN(40))
		for j := range b {
			b[j] = byte('!' + rng.IntN(94))
		}
		out = append(out, fmt.Sprintf("%02d%s", i, b))
	}
	return out
}

// BenchmarkWriter measures the redaction of text output in 64 KiB writes (as the supervisor
// reads a pipe) with a dozen secrets, a few of which occur.
func BenchmarkWriter(b *testing.B) {
	secrets := benchSecrets()
	rng := rand.New(rand.NewPCG(5, 6))
	data := make([]byte, 0, 8<<20)
	for len(data) < 8<<20 {
		if rng.IntN(1000) == 0 {
			data = append(data, secrets[rng.IntN(len(secrets))]...)
		}
		for range 10 + rng.IntN(70) {
			data = append(data, "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ0123456789:/-_."[rng.IntN(52)])
		}
		data = append(data, '\n')
	}
	r := New(secrets...)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		w := r.NewWriter(io.Discard)
		for p := data; len(p) > 0; {
			n := min(len(p), 64<<10)
			if _, err := w.Write(p[:n]); err != nil {
				b.Fatal(err)
			}
			p = p[n:]
		}
		if err := w.Flush(); err != nil {
			b.Fatal(err)
		}
	}
}
