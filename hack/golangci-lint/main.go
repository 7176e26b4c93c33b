// Command golangci-lint is golangci-lint with the logcheck plugin built in.
//
// It runs golangci-lint's own command line unchanged; the blank import
// registers logcheck (sigs.k8s.io/logtools/logcheck) with golangci-lint's
// module-plugin registry, so that .golangci.yml can enable it as a custom
// linter of `type: module`. See https://golangci-lint.run/plugins/module-plugins/.
package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"strings"

	"github.com/golangci/golangci-lint/v2/pkg/commands"
	"github.com/golangci/golangci-lint/v2/pkg/exitcodes"

	// Registers the "logcheck" module plugin.
	_ "sigs.k8s.io/logtools/logcheck/gclplugin"
)

const golangciModule = "github.com/golangci/golangci-lint/v2"

func main() {
	if err := commands.Execute(buildInfo()); err != nil {
		_, _ = fmt.Fprintf(os.Stderr, "The command is terminated due to an error: %v\n", err)
		os.Exit(exitcodes.Failure)
	}
}

// buildInfo reports golangci-lint's version (the one pinned in go.mod) as
// the binary's version, so that `golangci-lint version` names the release
// the checks come from; the commit says logcheck's version.
func buildInfo() commands.BuildInfo {
	info := commands.BuildInfo{Version: "unknown", Commit: "?", Date: "(unknown)", GoVersion: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return info
	}
	info.GoVersion = bi.GoVersion
	var plugins []string
	for _, dep := range bi.Deps {
		switch dep.Path {
		case golangciModule:
			info.Version = strings.TrimPrefix(dep.Version, "v")
		case "sigs.k8s.io/logtools":
			plugins = append(plugins, "logcheck "+dep.Version)
		}
	}
	info.Commit = "custom build with " + strings.Join(plugins, ", ")
	return info
}
