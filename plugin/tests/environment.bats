#!/usr/bin/env bats
# Tests of hooks/environment, the plugin's only hook. Run with `bats plugin/tests`
# (go test ./plugin runs them too). Needs bats-core, bats-support and bats-assert.

setup() {
  bats_load_library bats-support
  bats_load_library bats-assert

  HOOK="$(cd "$BATS_TEST_DIRNAME/../.." && pwd)/hooks/environment"
  STUBS="$BATS_TEST_DIRNAME/stubs"
  export PATH="$STUBS:$PATH"
  export BUILDKITE_AGENT_STUB_LOG="$BATS_TEST_TMPDIR/buildkite-agent.log"

  # Start from a job env without any plugin options of the caller's.
  local var
  while IFS= read -r var; do
    [[ "$var" == BUILDKITE_PLUGIN_* || "$var" == BUILDKITE_OPERATOR_* ]] && unset "$var"
  done < <(compgen -e)
  unset BUILDKITE_AGENT_STUB_EXIT

  export BUILDKITE_JOB_ID="0190e6b1-5f2c-4c1e-9d0a-3a7f1b2c4d5e"
  export BUILDKITE_AGENT_NAME="laptop-1"
  export BUILDKITE_AGENT_META_DATA_QUEUE="default"
  export BUILDKITE_LABEL=":go: test"
  export BUILDKITE_PLUGIN_NAME="BUILDKITE_OPERATOR"
  # Running under the operator unless a test says otherwise.
  export BUILDKITE_OPERATOR_JOB="buildkite/0190e6b1-5f2c-4c1e-9d0a-3a7f1b2c4d5e"
}

opt() { export "BUILDKITE_PLUGIN_BUILDKITE_OPERATOR_$1=$2"; }

refute_annotated() {
  [[ ! -e "$BUILDKITE_AGENT_STUB_LOG" ]] || fail "buildkite-agent was called: $(cat "$BUILDKITE_AGENT_STUB_LOG")"
}

@test "valid options under the operator pass quietly" {
  opt BUILD_ENVIRONMENT go-1-26
  opt LOG_PATHS_0 /workspace/service.log
  opt LOG_PATHS_1 /var/log/app/./x..y.log
  opt TIMEOUT_IN_MINUTES 30
  opt RESOURCES_REQUESTS_CPU 500m
  opt RESOURCES_REQUESTS_MEMORY 1Gi
  opt RESOURCES_REQUESTS_EPHEMERAL_STORAGE 10G
  opt RESOURCES_LIMITS_CPU 2
  opt RESOURCES_LIMITS_MEMORY 1.5Gi
  opt RESOURCES_LIMITS_EPHEMERAL_STORAGE 1e10
  run "$HOOK"
  assert_success
  assert_output "--- :kubernetes: buildkite-operator: options are valid (BuildJob buildkite/0190e6b1-5f2c-4c1e-9d0a-3a7f1b2c4d5e)"
  refute_annotated
}

@test "no options at all is fine: the BuildEnvironment's defaults apply" {
  run "$HOOK"
  assert_success
  assert_output --partial "options are valid"
}

@test "an empty build_environment means the operator's default" {
  opt BUILD_ENVIRONMENT ""
  run "$HOOK"
  assert_success
}

@test "sourced as the agent does, success leaves the calling shell running" {
  opt BUILD_ENVIRONMENT go
  run bash -c 'source "$1"; echo "after the hook"' _ "$HOOK"
  assert_success
  assert_line "after the hook"
}

@test "sourced as the agent does, failure fails the calling shell" {
  opt LOG_PATHS_0 relative.log
  run bash -c 'source "$1"; echo "after the hook"' _ "$HOOK"
  assert_failure 1
  refute_line "after the hook"
}

@test "an ordinary agent fails the step and says how to target the operator" {
  unset BUILDKITE_OPERATOR_JOB
  opt BUILD_ENVIRONMENT go-1-26
  run "$HOOK"
  assert_failure 1
  assert_output --partial "plugin buildkite-operator: this step ran on the ordinary Buildkite agent \"laptop-1\" (queue \"default\"), not under buildkite-operator, so its options would be ignored: target the operator's queue and tags in the step, such as"
  assert_line "    agents:"
  assert_line "      queue: bk-operator"
  assert_line "      cluster: <the cluster tag of your operator>"
  run cat "$BUILDKITE_AGENT_STUB_LOG"
  assert_line "args: annotate --style error --context buildkite-operator-0190e6b1-5f2c-4c1e-9d0a-3a7f1b2c4d5e"
  assert_line '**buildkite-operator** (step `:go: test`):'
  assert_output --partial "not under buildkite-operator"
}

@test "an ordinary agent with bad options reports both" {
  export BUILDKITE_OPERATOR_JOB=""
  opt LOG_PATHS_0 logs/app.log
  run "$HOOK"
  assert_failure 1
  assert_line --partial 'log_paths[0] "logs/app.log" is not an absolute path'
  assert_line --partial "not under buildkite-operator"
}

@test "a relative log path says to give the full path" {
  opt LOG_PATHS_0 /workspace/a.log
  opt LOG_PATHS_1 logs/app.log
  run "$HOOK"
  assert_failure 1
  assert_line "plugin buildkite-operator: log_paths[1] \"logs/app.log\" is not an absolute path: give the full path inside the job's container, such as /workspace/logs/app.log"
  assert_line "+++ :warning: buildkite-operator: this step cannot run as configured"
  run cat "$BUILDKITE_AGENT_STUB_LOG"
  assert_line --partial 'log_paths[1] "logs/app.log" is not an absolute path'
}

@test "a log path with .. is rejected" {
  opt LOG_PATHS_0 /workspace/../etc/passwd
  run "$HOOK"
  assert_failure 1
  assert_line 'plugin buildkite-operator: log_paths[0] "/workspace/../etc/passwd" contains "..": name the file by its absolute path without ".."'
}

@test "a log path ending in .. is rejected" {
  opt LOG_PATHS_0 /workspace/..
  run "$HOOK"
  assert_failure 1
  assert_line --partial 'contains ".."'
}

@test "an empty log path is rejected" {
  opt LOG_PATHS_0 ""
  run "$HOOK"
  assert_failure 1
  assert_line --partial "log_paths[0] is empty: give the full path of a file"
}

@test "a log path with a line break is rejected" {
  opt LOG_PATHS_0 $'/a\nb'
  run "$HOOK"
  assert_failure 1
  assert_line --partial "log_paths[0] contains a line break"
}

@test "a repeated log path is rejected" {
  opt LOG_PATHS_0 /workspace/a.log
  opt LOG_PATHS_1 /workspace/a.log
  run "$HOOK"
  assert_failure 1
  assert_line --partial "\"/workspace/a.log\" repeats log_paths[0]: list each file once"
}

@test "at most 16 log paths" {
  local i
  for i in $(seq 0 15); do opt "LOG_PATHS_$i" "/workspace/$i.log"; done
  run "$HOOK"
  assert_success
  opt LOG_PATHS_16 /workspace/16.log
  run "$HOOK"
  assert_failure 1
  assert_line "plugin buildkite-operator: log_paths lists 17 files, more than the 16 allowed: stream fewer files, or have the job write them into one"
}

@test "log_paths given as one string asks for a list" {
  opt LOG_PATHS /workspace/a.log
  run "$HOOK"
  assert_failure 1
  assert_line "plugin buildkite-operator: log_paths is a single value, not a list: write one absolute path per line, such as"
  assert_line "        - /workspace/a.log"
}

@test "a log_paths entry that is a map is rejected" {
  opt LOG_PATHS_0_PATH /workspace/a.log
  run "$HOOK"
  assert_failure 1
  assert_line --partial "log_paths[0] is not a string"
}

@test "an invalid build_environment name is rejected" {
  opt BUILD_ENVIRONMENT "Go 1.26"
  run "$HOOK"
  assert_failure 1
  assert_line --partial 'plugin buildkite-operator: build_environment "Go 1.26" is not a valid BuildEnvironment name'
  assert_line --partial "such as go-1-26"
  # BuildEnvironments live in the job namespace, not beside the operator's own Secrets.
  assert_line --partial "a BuildEnvironment in the operator's job namespace (buildkite-jobs by default)"
  assert_line --partial "kubectl -n buildkite-jobs get buildenvironments"
}

@test "a build_environment name longer than 253 characters is rejected" {
  opt BUILD_ENVIRONMENT "$(printf 'a%.0s' $(seq 254))"
  run "$HOOK"
  assert_failure 1
  assert_line --partial "is not a valid BuildEnvironment name"
}

@test "timeout_in_minutes must be a whole number" {
  opt TIMEOUT_IN_MINUTES 1h
  run "$HOOK"
  assert_failure 1
  assert_line 'plugin buildkite-operator: timeout_in_minutes "1h" is not a whole number of minutes: write it without quotes, such as timeout_in_minutes: 30'
}

@test "timeout_in_minutes must be from 1 to 10080" {
  local bad
  for bad in 0 10081 99999999999999999999; do
    opt TIMEOUT_IN_MINUTES "$bad"
    run "$HOOK"
    assert_failure 1
    assert_line --partial "timeout_in_minutes $bad is out of range: give a whole number of minutes from 1 to 10080"
  done
  opt TIMEOUT_IN_MINUTES 010080
  run "$HOOK"
  assert_success
}

@test "quantities must parse" {
  opt RESOURCES_LIMITS_MEMORY "4 GB"
  opt RESOURCES_REQUESTS_CPU lots
  opt RESOURCES_REQUESTS_EPHEMERAL_STORAGE 4gi
  run "$HOOK"
  assert_failure 1
  assert_line 'plugin buildkite-operator: resources.limits.memory "4 GB" is not a Kubernetes quantity: give a number with an optional unit, such as 512Mi or 4Gi'
  assert_line 'plugin buildkite-operator: resources.requests.cpu "lots" is not a Kubernetes quantity: give a number with an optional unit, such as 500m or 2'
  assert_line --partial 'resources.requests.ephemeral-storage "4gi" is not a Kubernetes quantity'
}

@test "negative quantities are rejected" {
  opt RESOURCES_REQUESTS_CPU -1
  run "$HOOK"
  assert_failure 1
  assert_line 'plugin buildkite-operator: resources.requests.cpu "-1" is negative: give a positive quantity, such as 500m or 2'
}

@test "resources given as one value asks for a map" {
  opt RESOURCES_REQUESTS 2
  run "$HOOK"
  assert_failure 1
  assert_line "plugin buildkite-operator: resources_requests is a single value, not a map: write it as, for example,"
}

@test "an unknown resource is rejected" {
  opt RESOURCES_REQUESTS_GPU 1
  run "$HOOK"
  assert_failure 1
  assert_line "plugin buildkite-operator: unknown resource setting (BUILDKITE_PLUGIN_BUILDKITE_OPERATOR_RESOURCES_REQUESTS_GPU): resources takes requests and limits, each of cpu, memory and ephemeral-storage"
}

@test "an unknown option is rejected" {
  opt LOG_PATH /workspace/a.log
  run "$HOOK"
  assert_failure 1
  assert_line "plugin buildkite-operator: unknown option \"log_path\" (BUILDKITE_PLUGIN_BUILDKITE_OPERATOR_LOG_PATH): the options are build_environment, log_paths, timeout_in_minutes, resources (check the spelling)"
}

@test "every problem is reported at once" {
  opt BUILD_ENVIRONMENT Bad
  opt LOG_PATHS_0 rel
  opt TIMEOUT_IN_MINUTES 0
  opt COLOUR blue
  run "$HOOK"
  assert_failure 1
  assert_line --partial "build_environment \"Bad\""
  assert_line --partial "log_paths[0] \"rel\""
  assert_line --partial "timeout_in_minutes 0"
  assert_line --partial "unknown option \"colour\""
}

@test "a .git source without the suffix gives the _GIT prefix, which is checked too" {
  export BUILDKITE_PLUGIN_NAME=BUILDKITE_OPERATOR_GIT
  export BUILDKITE_PLUGIN_BUILDKITE_OPERATOR_GIT_LOG_PATHS_0=relative.log
  run "$HOOK"
  assert_failure 1
  assert_line --partial 'log_paths[0] "relative.log" is not an absolute path'
}

@test "another plugin's variables are not this plugin's options" {
  export BUILDKITE_PLUGIN_DOCKER_IMAGE=golang
  opt BUILD_ENVIRONMENT go
  run "$HOOK"
  assert_success
}

@test "a failing annotate still fails the step with the message" {
  export BUILDKITE_AGENT_STUB_EXIT=1
  opt LOG_PATHS_0 rel.log
  run "$HOOK"
  assert_failure 1
  assert_line --partial 'log_paths[0] "rel.log" is not an absolute path'
  assert_line "(buildkite-operator: could not annotate the build; the messages above are the full story)"
}

@test "without buildkite-agent on PATH the step still fails with the message" {
  mkdir -p "$BATS_TEST_TMPDIR/empty-path"
  opt LOG_PATHS_0 rel.log
  PATH="$BATS_TEST_TMPDIR/empty-path" run /bin/bash "$HOOK"
  assert_failure 1
  assert_line --partial 'log_paths[0] "rel.log" is not an absolute path'
  refute_annotated
}
