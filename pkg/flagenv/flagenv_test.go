package flagenv_test

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
)

// pullPolicy stands for a named string type such as corev1.PullPolicy.
type pullPolicy string

// config holds one flag of every kind.
type config struct {
	name    string
	policy  pullPolicy
	slots   int
	scale   float64
	elect   bool
	timeout time.Duration
	tags    []string
}

func newSet(c *config) *flag.FlagSet {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	flagenv.String(fs, &c.name, "name", "T_NAME", "bk", "operator name")
	flagenv.String(fs, &c.policy, "pull-policy", "T_PULL_POLICY", "IfNotPresent", "pull policy")
	flagenv.Int(fs, &c.slots, "slots", "T_SLOTS", 10, "most jobs in flight")
	flagenv.Float64(fs, &c.scale, "scale", "T_SCALE", 1, "wait scale")
	flagenv.Bool(fs, &c.elect, "leader-elect", "T_LEADER_ELECT", true, "elect a leader")
	flagenv.Duration(fs, &c.timeout, "timeout", "T_TIMEOUT", 5*time.Minute, "how long")
	flagenv.Func(fs, "tags", "T_TAGS", "extra tags", func(v string) error {
		if v == "bad" {
			return errors.New("rejected")
		}
		c.tags = strings.Split(v, ",")
		return nil
	})
	return fs
}

func defaults() config {
	return config{name: "bk", policy: "IfNotPresent", slots: 10, scale: 1, elect: true, timeout: 5 * time.Minute}
}

func TestParse(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		want    func(c *config)
		wantErr string
	}{
		{name: "defaults when nothing is given", want: func(*config) {}},
		{
			name: "every kind from the environment",
			env: map[string]string{"T_NAME": "envname", "T_PULL_POLICY": "Always", "T_SLOTS": "3", "T_SCALE": "0.5",
				"T_LEADER_ELECT": "false", "T_TIMEOUT": "90s", "T_TAGS": "a=1,b=2"},
			want: func(c *config) {
				c.name, c.policy, c.slots, c.scale, c.elect, c.timeout, c.tags = "envname", "Always", 3, 0.5, false, 90*time.Second, []string{"a=1", "b=2"}
			},
		},
		{
			name: "an empty variable counts as unset, for every kind",
			env: map[string]string{"T_NAME": "", "T_PULL_POLICY": "", "T_SLOTS": "", "T_SCALE": "",
				"T_LEADER_ELECT": "", "T_TIMEOUT": "", "T_TAGS": ""},
			want: func(*config) {},
		},
		{
			name: "the command line wins over the environment",
			args: []string{"-name", "flagname", "-slots=4", "-leader-elect=true", "-timeout", "1m", "-tags", "c=3", "-pull-policy", "Never", "-scale", "2"},
			env: map[string]string{"T_NAME": "envname", "T_PULL_POLICY": "Always", "T_SLOTS": "3", "T_SCALE": "0.5",
				"T_LEADER_ELECT": "false", "T_TIMEOUT": "90s", "T_TAGS": "a=1"},
			want: func(c *config) {
				c.name, c.policy, c.slots, c.scale, c.timeout, c.tags = "flagname", "Never", 4, 2, time.Minute, []string{"c=3"}
			},
		},
		{
			name: "a bool flag alone means true",
			args: []string{"-leader-elect"},
			env:  map[string]string{"T_LEADER_ELECT": "false"},
			want: func(*config) {},
		},
		{
			name: "a bool variable takes what the flag takes",
			env:  map[string]string{"T_LEADER_ELECT": "0"},
			want: func(c *config) { c.elect = false },
		},
		{
			name:    "an int the variable spells wrong names the variable",
			env:     map[string]string{"T_SLOTS": "ten"},
			wantErr: `invalid value "ten" in T_SLOTS (for -slots): not an integer`,
		},
		{
			name:    "a duration without a unit",
			env:     map[string]string{"T_TIMEOUT": "90"},
			wantErr: `invalid value "90" in T_TIMEOUT (for -timeout): not a duration such as 90s or 5m`,
		},
		{
			name:    "a bool that is not one",
			env:     map[string]string{"T_LEADER_ELECT": "no"},
			wantErr: `invalid value "no" in T_LEADER_ELECT (for -leader-elect): not a boolean: use true or false`,
		},
		{
			name:    "a float that is not one",
			env:     map[string]string{"T_SCALE": "x"},
			wantErr: `invalid value "x" in T_SCALE (for -scale): not a number`,
		},
		{
			name:    "a wrong flag is the flag package's error",
			args:    []string{"-slots", "ten"},
			wantErr: `invalid value "ten" for flag -slots: not an integer`,
		},
		{
			name:    "a Func variable's error is reported",
			env:     map[string]string{"T_TAGS": "bad"},
			wantErr: `invalid value "bad" in T_TAGS (for -tags): rejected`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c config
			fs := newSet(&c)
			err := flagenv.ParseEnv(fs, tc.args, func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				require.EqualError(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			want := defaults()
			tc.want(&want)
			assert.Equal(t, want, c)
		})
	}
}

// A value from the environment is not one given on the command line: callers that
// look at fs.Visit (which flags were given) see only the command line.
func TestEnvironmentValuesAreNotVisited(t *testing.T) {
	var c config
	fs := newSet(&c)
	require.NoError(t, flagenv.ParseEnv(fs, []string{"-slots", "2"}, func(k string) string {
		return map[string]string{"T_NAME": "x", "T_TAGS": "a=1"}[k]
	}))
	var visited []string
	fs.Visit(func(f *flag.Flag) { visited = append(visited, f.Name) })
	assert.Equal(t, []string{"slots"}, visited)
	assert.Equal(t, "x", c.name)
}

func TestParseReadsTheProcessEnvironment(t *testing.T) {
	t.Setenv("T_SLOTS", "7")
	t.Setenv("T_NAME", "")
	var c config
	require.NoError(t, flagenv.Parse(newSet(&c), nil))
	assert.Equal(t, 7, c.slots)
	assert.Equal(t, "bk", c.name)
}

func TestList(t *testing.T) {
	t.Setenv("T_SLOTS", "7") // defaults never depend on the environment
	var c config
	fs := newSet(&c)
	fs.String("plain", "p", "a flag without a twin")
	assert.Equal(t, []flagenv.Flag{
		{Name: "leader-elect", Env: "T_LEADER_ELECT", Type: "bool", Default: "true", Usage: "elect a leader"},
		{Name: "name", Env: "T_NAME", Type: "string", Default: "bk", Usage: "operator name"},
		{Name: "plain", Type: "string", Default: "p", Usage: "a flag without a twin"},
		{Name: "pull-policy", Env: "T_PULL_POLICY", Type: "string", Default: "IfNotPresent", Usage: "pull policy"},
		{Name: "scale", Env: "T_SCALE", Type: "float", Default: "1", Usage: "wait scale"},
		{Name: "slots", Env: "T_SLOTS", Type: "int", Default: "10", Usage: "most jobs in flight"},
		{Name: "tags", Env: "T_TAGS", Type: "value", Default: "", Usage: "extra tags"},
		{Name: "timeout", Env: "T_TIMEOUT", Type: "duration", Default: "5m0s", Usage: "how long"},
	}, flagenv.List(fs))
}

func TestHelpNamesTheVariable(t *testing.T) {
	var c config
	fs := newSet(&c)
	var out bytes.Buffer
	fs.SetOutput(&out)
	fs.Usage = flagenv.Usage(fs, "test [flags]")
	require.ErrorIs(t, flagenv.Parse(fs, []string{"-h"}), flag.ErrHelp)
	help := out.String()
	for _, want := range []string{
		"usage: test [flags]\n",
		"  -slots int\n    \tmost jobs in flight (env T_SLOTS) (default 10)\n",
		"  -leader-elect\n    \telect a leader (env T_LEADER_ELECT) (default true)\n",
		"  -name string\n    \toperator name (env T_NAME) (default \"bk\")\n",
		"  -timeout duration\n    \thow long (env T_TIMEOUT) (default 5m0s)\n",
		"  -tags value\n    \textra tags (env T_TAGS)\n",
	} {
		assert.Contains(t, help, want)
	}
	// flag's own printer shows the variable too: it is part of the flag's usage.
	assert.Equal(t, "most jobs in flight (env T_SLOTS)", fs.Lookup("slots").Usage)
	out.Reset()
	fs.PrintDefaults()
	assert.Contains(t, out.String(), "(env T_SLOTS)")
}

func TestAdopt(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	devel := fs.Bool("devel", false, "development mode")
	level := fs.String("level", "info", "log level")
	flagenv.Adopt(fs, "devel", "T_DEVEL")
	flagenv.Adopt(fs, "level", "T_LEVEL")

	require.NoError(t, flagenv.ParseEnv(fs, []string{"-devel"}, func(k string) string {
		return map[string]string{"T_DEVEL": "false", "T_LEVEL": "debug"}[k]
	}))
	assert.True(t, *devel, "an adopted bool flag still stands alone")
	assert.Equal(t, "debug", *level)
	assert.Equal(t, []flagenv.Flag{
		{Name: "devel", Env: "T_DEVEL", Type: "bool", Default: "false", Usage: "development mode"},
		{Name: "level", Env: "T_LEVEL", Type: "string", Default: "info", Usage: "log level"},
	}, flagenv.List(fs))

	assert.Panics(t, func() { flagenv.Adopt(fs, "level", "T_OTHER") }, "a second twin")
	assert.Panics(t, func() { flagenv.Adopt(fs, "missing", "T_MISSING") })
}

func TestVar(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	var level string
	v := &stringValue{p: &level}
	level = "info"
	flagenv.Var(fs, v, "level", "T_LEVEL", "log level")
	require.NoError(t, flagenv.ParseEnv(fs, nil, func(k string) string { return map[string]string{"T_LEVEL": "debug"}[k] }))
	assert.Equal(t, "debug", level)
	assert.Equal(t, "info", fs.Lookup("level").DefValue)
}

type stringValue struct{ p *string }

func (s *stringValue) Set(v string) error { *s.p = v; return nil }
func (s *stringValue) String() string {
	if s == nil || s.p == nil {
		return ""
	}
	return *s.p
}
