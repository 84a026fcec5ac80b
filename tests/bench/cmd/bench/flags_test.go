package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseRate(t *testing.T) {
	tests := []struct {
		in   string
		want rateFlag
		err  bool
	}{
		{"", rateFlag{}, false},
		{"5", rateFlag{perSecond: 5}, false},
		{" 2.5 ", rateFlag{perSecond: 2.5}, false},
		{"0.5x", rateFlag{fraction: 0.5}, false},
		{"0", rateFlag{}, true},
		{"-1x", rateFlag{}, true},
		{"fast", rateFlag{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseRate(tt.in)
			if tt.err {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseSizes(t *testing.T) {
	got, err := parseSizes("10, 100,1000")
	require.NoError(t, err)
	assert.Equal(t, []int{10, 100, 1000}, got)
	for _, bad := range []string{"", "10,", "0", "ten"} {
		_, err := parseSizes(bad)
		assert.Error(t, err, bad)
	}
}
