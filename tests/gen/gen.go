// Package gen builds BuildJobs and BuildEnvironments for tests: a valid object with
// sensible defaults, changed by modifiers, as in
//
//	job := gen.BuildJob("j", gen.SetBuildJobNamespace("ci"), gen.SetBuildJobEnvironment("go"))
//	env := gen.BuildEnvironment("go", gen.SetBuildEnvironmentRunner(v1alpha1.RunnerBootstrap))
//
// A test's own fixture is a gen object with the test's defaults; BuildJobFrom and
// BuildEnvironmentFrom copy one with changes.
//
// Each builder returns a new object; modifiers apply in order, so a later one wins. A nil
// modifier is skipped, so that a test table's empty modifier can be passed as it is.
package gen

// apply runs mods on obj, in order, skipping nil ones, and returns obj.
func apply[T any, M ~func(T)](obj T, mods []M) T {
	for _, m := range mods {
		if m != nil {
			m(obj)
		}
	}
	return obj
}
