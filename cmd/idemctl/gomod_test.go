package main

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Importing the library must not pull in the command's dependencies: they
// belong in this module's go.mod, never in the library's.
func TestLibraryGoModHasNoCLIDependencies(t *testing.T) {
	lib, err := os.ReadFile("../../go.mod")
	require.NoError(t, err)
	own, err := os.ReadFile("go.mod")
	require.NoError(t, err)
	for _, dep := range []string{
		"github.com/schollz/progressbar",
		"golang.org/x/term",
		"github.com/mitchellh/colorstring",
		"github.com/rivo/uniseg",
	} {
		assert.NotContains(t, string(lib), dep, "the library's go.mod")
	}
	assert.Contains(t, string(own), "github.com/schollz/progressbar/v3", "this module's go.mod holds them instead")
	assert.Contains(t, string(lib), "module github.com/idemkit/idemhttp\n")
}
