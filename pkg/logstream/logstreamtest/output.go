// Package logstreamtest holds what the log-streaming benchmarks share: realistic job output
// with secrets in it, and the CPU time a process used.
package logstreamtest

import (
	"math/rand/v2"
	"strconv"
	"syscall"
	"time"
)

// Secrets are a dozen secrets as a job's environment holds them: the job token, tokens,
// passwords, keys, a connection string and a private key of several lines.
func Secrets() []string {
	return []string{
		"bkaj_4f6c2a9e0b1d7c3e5a8f9b2d4e6c8a0b1c3d5e7f",
		"ghp_Xy7Qm2Lk9Pz4Rt6Vw8Bn3Cd5Fg1Hj0Ks",
		"hunter2-Correct-Horse-Battery-Staple",
		"AKIAIOSFODNN7EXAMPLE",
		"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
		"postgres://app:s3cr3t-pw@db.internal:5432/app?sslmode=require",
		"sk_live_51H8x2kLmN0pQrStUvWxYz",
		"xoxb-123456789012-123456789012-AbCdEfGhIjKlMnOpQrStUvWx",
		"npm_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
		"glpat-Ab12Cd34Ef56Gh78Ij90",
		"dckr_pat_2b3c4d5e6f7g8h9i0j1k2l3m4n5o",
		"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\nQyNTUxOQAAACBsZWNyZXQtc2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0AAAAoGFiY2Rl\n-----END OPENSSH PRIVATE KEY-----",
	}
}

// JobOutput returns n bytes of what CI jobs print: test and build lines of varied length,
// colour codes, carriage-return progress, a long line now and then, a little binary, and
// now and then one of secrets (about one line in 5000).
func JobOutput(n int, secrets []string, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x5eed))
	words := []string{"ok", "PASS", "FAIL", "github.com/acme/service/internal/store", "compiling", "TestHandler/returns_404",
		"0.012s", "warning:", "npm", "WARN", "deprecated", "=>", "[1/4]", "Resolving", "packages...", "Step", "RUN", "go", "build", "-o", "bin/app"}
	out := make([]byte, 0, n+512)
	for len(out) < n {
		switch k := r.IntN(1000); {
		case k < 2 && len(secrets) > 0:
			out = append(out, "export TOKEN="...)
			out = append(out, secrets[r.IntN(len(secrets))]...)
			out = append(out, '\n')
		case k < 5: // a long line: minified JSON, a stack trace joined
			for range 2000 + r.IntN(20000) {
				out = append(out, byte('!'+r.IntN(94)))
			}
			out = append(out, '\n')
		case k < 7: // binary that slipped into the output
			for range r.IntN(512) {
				out = append(out, byte(r.IntN(256)))
			}
		case k < 60: // progress bars redrawn with carriage returns
			out = append(out, "Downloading "...)
			out = strconv.AppendInt(out, int64(r.IntN(100)), 10)
			out = append(out, "%\r"...)
		case k < 200:
			out = append(out, "\x1b[32m--- PASS\x1b[0m: "...)
			out = append(out, words[r.IntN(len(words))]...)
			out = append(out, " (0.00s)\n"...)
		default:
			for w := range 3 + r.IntN(12) {
				if w > 0 {
					out = append(out, ' ')
				}
				out = append(out, words[r.IntN(len(words))]...)
			}
			out = append(out, '\n')
		}
	}
	return out[:n]
}

// CPUTime is the CPU time (user and system) the calling process has used so far.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return RusageCPU(&ru)
}

// RusageCPU is the CPU time, user and system, of ru.
func RusageCPU(ru *syscall.Rusage) time.Duration {
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
