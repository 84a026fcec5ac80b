//go:build race

package supervisor

// raceEnabled: the race detector multiplies memory use, so memory bounds are not checked.
const raceEnabled = true
