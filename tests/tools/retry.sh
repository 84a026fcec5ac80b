#!/usr/bin/env bash
# retry.sh CMD [ARG...]: runs CMD up to three times, 15 s apart, for the Makefile's steps
# that fetch from the Go module proxy and its checksum database. A cold build makes
# thousands of requests there, and one 503 from sum.golang.org (23 November 2026, 19:44)
# failed a whole CI run 35 minutes in. Go keeps what it has downloaded, so a retry fetches
# only what is missing.
set -u
for try in 1 2 3; do
	"$@" && exit 0
	rc=$?
	if [ "$try" = 3 ]; then
		exit "$rc"
	fi
	echo "retry.sh: '$*' failed (exit $rc); trying again in 15 s ($try of 3)" >&2
	sleep 15
done
