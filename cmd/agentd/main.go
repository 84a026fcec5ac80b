// Command agentd is buildkite-operator's one binary.
//
//	agentd operator    the JobSpawner, the reaper controller, the webhooks and metrics
//	agentd supervise   runs one job inside its pod and streams its output to Buildkite
//	agentd install     copies agentd-supervise into a shared volume (the job pod's init container)
//	agentd drain       ends every job before an uninstall (the chart's pre-delete hook)
//	agentd spawner     runs the JobSpawner alone
//	agentd version     prints the version
//
// This package only wires: it binds each component's flags and hands them to the packages
// that do the work (pkg/spawner, pkg/controller/buildjob, pkg/webhook, pkg/leaderelection,
// pkg/drain, pkg/install, pkg/startupcheck, pkg/memlimit, ...), so that what the operator
// does is found, and tested, in the package named for it.
//
// `agentd operator -h` and `agentd spawner -h` list every flag with its environment
// variable; docs/configuration.md has them as tables.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

type command struct {
	name, summary string
	run           func(args []string) error
}

var commands []command

// register adds a command; each command's file registers itself from init.
func register(c command) { commands = append(commands, c) }

func init() {
	register(command{"version", "print the version", func([]string) error {
		fmt.Println("agentd", version)
		return nil
	}})
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	for _, c := range commands {
		if c.name == os.Args[1] {
			err := c.run(os.Args[2:])
			if errors.Is(err, flag.ErrHelp) {
				return // the command's flags printed the help asked for
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "agentd %s: %v\n", c.name, err)
				os.Exit(1)
			}
			return
		}
	}
	fmt.Fprintf(os.Stderr, "agentd: unknown command %q\n", os.Args[1])
	usage()
	os.Exit(2)
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: agentd <command> [flags]\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", c.name, c.summary)
	}
}
