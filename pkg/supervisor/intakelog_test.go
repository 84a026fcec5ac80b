package supervisor

import (
	"context"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/logstream"
	"github.com/buildkite-operator/buildkite-operator/pkg/redact"
)

var timestampMark = regexp.MustCompile("\x1b_bk;t=[0-9]+\a")

func TestIntakeLog(t *testing.T) {
	const verified = "~~~ ✅ Job signature verified\nsignature: eyJhbGciOiJFUzI1NiJ9..sig\n"
	cases := []struct {
		name     string
		env      []string
		wantText string
		wantRest []string
	}{{
		name:     "none",
		env:      []string{"PATH=/bin", "A=1"},
		wantRest: []string{"PATH=/bin", "A=1"},
	}, {
		name:     "the spawner's lines, taken out of the job's env",
		env:      []string{"PATH=/bin", "BK_OPERATOR_INTAKE_LOG=" + verified, "A=1"},
		wantText: verified,
		wantRest: []string{"PATH=/bin", "A=1"},
	}, {
		name:     "empty",
		env:      []string{"BK_OPERATOR_INTAKE_LOG=", "A=1"},
		wantRest: []string{"A=1"},
	}, {
		name:     "twice: the last, as a process reads its env, and neither left",
		env:      []string{"BK_OPERATOR_INTAKE_LOG=first", "A=1", "BK_OPERATOR_INTAKE_LOG=second"},
		wantText: "second",
		wantRest: []string{"A=1"},
	}, {
		name:     "a name that only begins the same",
		env:      []string{"BK_OPERATOR_INTAKE_LOGS=x", "BK_OPERATOR_INTAKE_LOG_X=y"},
		wantRest: []string{"BK_OPERATOR_INTAKE_LOGS=x", "BK_OPERATOR_INTAKE_LOG_X=y"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := slices.Clone(tc.env)
			text, rest := IntakeLog(tc.env)
			assert.Equal(t, tc.wantText, text)
			assert.Equal(t, tc.wantRest, rest)
			assert.Equal(t, before, tc.env, "the env given is not changed")
		})
	}
}

// printIntakeLog puts the lines first in the job's log, redacted as everything else, and
// leaves the job an env without them.
func TestPrintIntakeLog(t *testing.T) {
	cases := []struct {
		name    string
		env     []string
		wantLog string
	}{
		{"lines", []string{"BK_OPERATOR_INTAKE_LOG=+++ ⚠️ Job signature verification failed\nJob will be run without verification\n", "A=1"},
			"+++ ⚠️ Job signature verification failed\nJob will be run without verification\n"},
		{"redacted", []string{"BK_OPERATOR_INTAKE_LOG=token hunter2-hunter2\n", "A=1"}, "token [REDACTED]\n"},
		{"nothing", []string{"A=1"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var got []byte
			stream, err := logstream.New(logstream.Config{
				MaxChunkBytes: 1 << 16,
				Interval:      time.Millisecond,
				Redactor:      redact.New("hunter2-hunter2"),
				Upload: func(_ context.Context, _, _ uint64, data []byte) error {
					mu.Lock()
					defer mu.Unlock()
					got = append(got, data...)
					return nil
				},
			})
			require.NoError(t, err)
			j := &job{conf: Config{Env: tc.env}, stream: stream}
			j.printIntakeLog()
			_, err = stream.Close(context.Background())
			require.NoError(t, err)
			mu.Lock()
			defer mu.Unlock()
			// Each line carries the agent's timestamp mark, which is not the point here.
			assert.Equal(t, tc.wantLog, timestampMark.ReplaceAllString(string(got), ""))
			assert.Equal(t, []string{"A=1"}, j.conf.Env)
		})
	}
}
