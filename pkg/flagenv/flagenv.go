// Package flagenv binds command-line flags that each have an environment variable twin, so
// that a Deployment may configure a component with either.
//
// A flag bound here takes its value from, first to last: the command line; its environment
// variable, when that is set and not empty; its default. An empty variable counts as unset
// for every kind of flag, and a variable's value is parsed exactly as the flag's value on
// the command line would be.
//
// The environment is read by Parse, after the command line, never when a flag is bound:
// the defaults that -h and List show are the code's own, whatever the environment holds.
//
//	var slots int
//	fs := flag.NewFlagSet("operator", flag.ContinueOnError)
//	flagenv.Int(fs, &slots, "slots", "BK_OPERATOR_SLOTS", 10, "most jobs in flight")
//	fs.Usage = flagenv.Usage(fs, "agentd operator [flags]")
//	err := flagenv.Parse(fs, os.Args[1:])
package flagenv

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// String binds a flag of a string type (string itself, or a named string type such as
// corev1.PullPolicy) to p, with default def and the environment twin env.
func String[T ~string](fs *flag.FlagSet, p *T, name, env string, def T, usage string) {
	*p = def
	bind(fs, &value[T]{p: p, kind: "string", format: func(v T) string { return string(v) },
		parse: func(s string) (T, error) { return T(s), nil }}, name, env, usage)
}

// Int binds an int flag to p, with default def and the environment twin env. It accepts
// what flag.FlagSet.Int accepts (decimal, 0x hexadecimal, 0o octal, 0b binary).
func Int(fs *flag.FlagSet, p *int, name, env string, def int, usage string) {
	*p = def
	bind(fs, &value[int]{p: p, kind: "int", format: strconv.Itoa, parse: func(s string) (int, error) {
		n, err := strconv.ParseInt(s, 0, strconv.IntSize)
		if err != nil {
			return 0, errors.New("not an integer")
		}
		return int(n), nil
	}}, name, env, usage)
}

// Float64 binds a float64 flag to p, with default def and the environment twin env.
func Float64(fs *flag.FlagSet, p *float64, name, env string, def float64, usage string) {
	*p = def
	bind(fs, &value[float64]{p: p, kind: "float",
		format: func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) },
		parse: func(s string) (float64, error) {
			f, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return 0, errors.New("not a number")
			}
			return f, nil
		}}, name, env, usage)
}

// Bool binds a bool flag to p, with default def and the environment twin env. On the
// command line -name alone means true; the variable, like -name=value, takes what
// strconv.ParseBool accepts (1, t, true, 0, f, false, in any case).
func Bool(fs *flag.FlagSet, p *bool, name, env string, def bool, usage string) {
	*p = def
	bind(fs, &value[bool]{p: p, kind: "bool", format: strconv.FormatBool, parse: func(s string) (bool, error) {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return false, errors.New("not a boolean: use true or false")
		}
		return b, nil
	}}, name, env, usage)
}

// Duration binds a time.Duration flag to p, with default def and the environment twin
// env. Values are time.ParseDuration's, such as 90s or 5m.
func Duration(fs *flag.FlagSet, p *time.Duration, name, env string, def time.Duration, usage string) {
	*p = def
	bind(fs, &value[time.Duration]{p: p, kind: "duration", format: time.Duration.String,
		parse: func(s string) (time.Duration, error) {
			d, err := time.ParseDuration(s)
			if err != nil {
				return 0, errors.New("not a duration such as 90s or 5m")
			}
			return d, nil
		}}, name, env, usage)
}

// Func binds a flag that calls fn with each value it is given, from the command line or,
// when the flag is not on the command line, from env. It has no default: fn is not
// called when neither gives a value.
func Func(fs *flag.FlagSet, name, env, usage string, fn func(string) error) {
	bind(fs, &funcValue{fn: fn}, name, env, usage)
}

// Var binds a flag of any flag.Value, with the environment twin env. Its default is
// what v holds now.
func Var(fs *flag.FlagSet, v flag.Value, name, env, usage string) {
	bind(fs, v, name, env, usage)
}

// Adopt gives env as a twin to the flag name that fs already holds, such as one that
// another package's BindFlags defined. It panics if fs has no such flag or the flag has
// a twin already, as binding a flag twice does.
func Adopt(fs *flag.FlagSet, name, env string) {
	f := fs.Lookup(name)
	if f == nil {
		panic(fmt.Sprintf("flagenv: %s has no flag -%s to adopt", fs.Name(), name))
	}
	if _, ok := f.Value.(*envValue); ok {
		panic(fmt.Sprintf("flagenv: flag -%s already has an environment variable", name))
	}
	f.Value = &envValue{Value: f.Value, env: env, meaning: f.Usage}
	f.Usage = withEnv(f.Usage, env)
}

func bind(fs *flag.FlagSet, v flag.Value, name, env, usage string) {
	if env == "" {
		panic(fmt.Sprintf("flagenv: flag -%s has no environment variable", name))
	}
	fs.Var(&envValue{Value: v, env: env, meaning: usage}, name, withEnv(usage, env))
}

// withEnv is how every flag's help names its environment variable.
func withEnv(usage, env string) string { return usage + " (env " + env + ")" }

// Parse parses args into fs, then sets each flag that args did not give from its
// environment variable, when that is set and not empty. An environment value the flag
// rejects is an error that names the variable.
func Parse(fs *flag.FlagSet, args []string) error {
	return ParseEnv(fs, args, os.Getenv)
}

// ParseEnv is Parse with getenv in place of os.Getenv.
func ParseEnv(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		ev, ok := f.Value.(*envValue)
		if !ok || given[f.Name] {
			return
		}
		s := getenv(ev.env)
		if s == "" {
			return
		}
		// The flag's own Value, not fs.Set: a value from the environment does not count
		// as given on the command line (fs.Visit does not see it).
		if err := ev.Value.Set(s); err != nil {
			errs = append(errs, fmt.Errorf("invalid value %q in %s (for -%s): %w", s, ev.env, f.Name, err))
		}
	})
	return errors.Join(errs...)
}

// Flag describes one flag of a FlagSet, for help and documentation.
type Flag struct {
	// Name is the flag's name, without the dash.
	Name string
	// Env is its environment variable; empty for a flag not bound by this package.
	Env string
	// Type is what its value is: string, int, float, bool, duration, or another name
	// (value when the flag's Value does not say).
	Type string
	// Default is the default as flag.Flag.DefValue spells it.
	Default string
	// Usage is what the flag means, without the note naming the environment variable.
	Usage string
}

// List returns every flag of fs, sorted by name.
func List(fs *flag.FlagSet) []Flag {
	var out []Flag
	fs.VisitAll(func(f *flag.Flag) {
		fl := Flag{Name: f.Name, Type: typeName(f.Value), Default: f.DefValue, Usage: f.Usage}
		if ev, ok := f.Value.(*envValue); ok {
			fl.Env, fl.Usage = ev.env, ev.meaning
		}
		out = append(out, fl)
	})
	return out
}

// Usage returns a function for fs.Usage: synopsis, a line on the environment variables,
// then PrintDefaults to fs.Output().
func Usage(fs *flag.FlagSet, synopsis string) func() {
	return func() {
		w := fs.Output()
		fmt.Fprintf(w, "usage: %s\n\n", synopsis)
		fmt.Fprintln(w, "Each flag may instead be given by the environment variable named in its help; the")
		fmt.Fprintln(w, "command line wins, and an empty variable counts as unset.")
		fmt.Fprintln(w)
		PrintDefaults(w, fs)
	}
}

// PrintDefaults writes every flag of fs to w as flag.PrintDefaults does, with each flag's
// type and, in its help, its environment variable.
func PrintDefaults(w io.Writer, fs *flag.FlagSet) {
	for _, f := range List(fs) {
		var b strings.Builder
		b.WriteString("  -" + f.Name)
		if f.Type != "bool" {
			b.WriteString(" " + f.Type)
		}
		b.WriteString("\n    \t" + strings.ReplaceAll(f.Usage, "\n", "\n    \t"))
		if f.Env != "" {
			b.WriteString(" (env " + f.Env + ")")
		}
		if !isZero(f) {
			if f.Type == "string" {
				fmt.Fprintf(&b, " (default %q)", f.Default)
			} else {
				fmt.Fprintf(&b, " (default %s)", f.Default)
			}
		}
		fmt.Fprintln(w, b.String())
	}
}

func isZero(f Flag) bool {
	switch f.Default {
	case "":
		return true
	case "0":
		return f.Type == "int" || f.Type == "float"
	case "false":
		return f.Type == "bool"
	case "0s":
		return f.Type == "duration"
	}
	return false
}

// typeName names what a flag's value is.
func typeName(v flag.Value) string {
	if ev, ok := v.(*envValue); ok {
		v = ev.Value
	}
	if bf, ok := v.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
		return "bool"
	}
	if t, ok := v.(interface{ Type() string }); ok {
		return t.Type()
	}
	// flag's own Values do not say; UnquoteUsage knows them.
	name, _ := flag.UnquoteUsage(&flag.Flag{Value: v})
	return name
}

// envValue is a flag's Value with its environment variable.
type envValue struct {
	flag.Value
	env     string
	meaning string
}

// String is explicit so that the zero envValue, which flag.PrintDefaults makes to find
// a Value's zero, has one.
func (e *envValue) String() string {
	if e == nil || e.Value == nil {
		return ""
	}
	return e.Value.String()
}

// IsBoolFlag lets a bool flag stand alone on the command line (-name for -name=true).
func (e *envValue) IsBoolFlag() bool {
	bf, ok := e.Value.(interface{ IsBoolFlag() bool })
	return ok && bf.IsBoolFlag()
}

// Get returns the underlying value, as flag's own Values do (flag.Getter).
func (e *envValue) Get() any {
	if g, ok := e.Value.(flag.Getter); ok {
		return g.Get()
	}
	return e.Value.String()
}

// value is a typed flag.Value writing into p.
type value[T any] struct {
	p      *T
	kind   string
	parse  func(string) (T, error)
	format func(T) string
}

func (v *value[T]) Set(s string) error {
	x, err := v.parse(s)
	if err != nil {
		return err
	}
	*v.p = x
	return nil
}

func (v *value[T]) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return v.format(*v.p)
}

func (v *value[T]) Get() any         { return *v.p }
func (v *value[T]) Type() string     { return v.kind }
func (v *value[T]) IsBoolFlag() bool { return v.kind == "bool" }

// funcValue is Func's Value.
type funcValue struct{ fn func(string) error }

func (f *funcValue) Set(s string) error { return f.fn(s) }
func (f *funcValue) String() string     { return "" }
func (f *funcValue) Type() string       { return "value" }
