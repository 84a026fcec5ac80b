// Module zzglob stands in for drjosh.dev/zzglob, which the agent imports for its glob
// patterns and which the Go module proxy here refuses (403 for every version). It is the
// project's own implementation of exactly the calls buildkite-agent v3.138 makes; the
// tools module one level up points the agent at it with a replace directive.
module drjosh.dev/zzglob

go 1.26.5
