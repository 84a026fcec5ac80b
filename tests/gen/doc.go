// Package gen builds BuildJobs and BuildEnvironments for tests: a valid object with
// sensible defaults, changed by modifiers, as in
//
//	job := gen.BuildJob("j", gen.SetBuildJobNamespace("ci"), gen.SetBuildJobEnvironment("go"))
//	env := gen.BuildEnvironment("go", gen.SetBuildEnvironmentRunner(v1alpha1.RunnerBootstrap))
//
// Each builder returns a new object; modifiers apply in order, so a later one wins. A nil
// modifier is skipped, so that a test table's empty modifier can be passed as it is.
package gen
