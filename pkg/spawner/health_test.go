package spawner

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHealth(t *testing.T) {
	now := time.Unix(1000, 0)
	h := newHealth()
	h.now = func() time.Time { return now }

	require.NoError(t, h.ready(), "a standby (spawner not started) is ready")
	require.NoError(t, h.live())

	h.start(3)
	assert.EqualError(t, h.ready(), "0 of 3 slots are registered with Buildkite")
	h.tried(0, true)
	h.tried(1, true)
	assert.EqualError(t, h.ready(), "2 of 3 slots are registered with Buildkite")
	h.tried(2, true)
	assert.NoError(t, h.ready())

	// A registration dropped (revoked agent) makes the replica unready until it is back.
	h.tried(1, false)
	assert.Error(t, h.ready())
	h.tried(1, true)

	now = now.Add(StaleAfter - time.Second)
	h.tried(0, true)
	h.tried(1, true)
	assert.NoError(t, h.live(), "slot 2 tried within StaleAfter")
	now = now.Add(2 * time.Second)
	assert.ErrorContains(t, h.live(), "slot 2 has not pinged or heartbeated for")
	h.tried(2, true)
	assert.NoError(t, h.live())
}
