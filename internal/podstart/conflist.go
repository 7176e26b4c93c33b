package podstart

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/egressip/egressip/internal/podstart/cniapi"
)

// Entry is the plugin's entry in a network configuration list.
type Entry struct {
	// Socket is the agent's socket the plugin asks (cniapi.DefaultSocket
	// when empty).
	Socket string
	// TimeoutSeconds bounds the plugin's wait for the agent (0: the
	// plugin's default, cniapi.DefaultTimeout).
	TimeoutSeconds int
}

func (e Entry) json() map[string]any {
	m := map[string]any{"type": cniapi.PluginType}
	if e.Socket != "" {
		m["socket"] = e.Socket
	}
	if e.TimeoutSeconds > 0 {
		m["timeoutSeconds"] = json.Number(fmt.Sprint(e.TimeoutSeconds))
	}
	return m
}

// backupName is where Install keeps the list as it was before our entry
// went in: a hidden file whose extension no runtime loads (libcni reads
// only .conf, .conflist and .json).
func backupName(path string) string {
	return filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".egressip-orig")
}

// configFiles returns the network configuration files of dir in the order
// the runtime picks them (libcni.ConfFiles: .conf, .conflist, .json, by
// name): the runtime uses the first.
func configFiles(dir string) ([]string, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read CNI configuration directory: %w", err)
	}
	var out []string
	for _, de := range des {
		if de.IsDir() || strings.HasPrefix(de.Name(), ".") {
			continue
		}
		switch filepath.Ext(de.Name()) {
		case ".conf", ".conflist", ".json":
			out = append(out, filepath.Join(dir, de.Name()))
		}
	}
	slices.Sort(out)
	return out, nil
}

// parseList decodes a configuration list, keeping numbers as written.
func parseList(b []byte) (map[string]any, []any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		return nil, nil, fmt.Errorf("parse: %w", err)
	}
	ps, ok := m["plugins"].([]any)
	if !ok {
		return nil, nil, errors.New(`not a configuration list (no "plugins" array): convert the single-plugin configuration to a .conflist to chain egressip-cni`)
	}
	return m, ps, nil
}

func isOurs(p any) bool {
	m, ok := p.(map[string]any)
	return ok && m["type"] == cniapi.PluginType
}

// withEntry returns b with every entry of ours removed and e appended as
// the last plugin of the chain (after the main plugin and any other
// chained ones: the IPs are known by then).
func withEntry(b []byte, e *Entry) ([]byte, error) {
	m, ps, err := parseList(b)
	if err != nil {
		return nil, err
	}
	ps = slices.DeleteFunc(ps, isOurs)
	if e != nil {
		ps = append(ps, e.json())
	}
	m["plugins"] = ps
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	return append(out, '\n'), nil
}

// writeAtomic replaces path with b: a temporary file in the same
// directory (a name no runtime loads), synced, given path's mode, then
// renamed over path, so a runtime reading the directory sees the old or
// the new list, never a part.
func writeAtomic(path string, b []byte, mode os.FileMode) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".egressip-tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Install puts e as the last plugin of the first network configuration
// list in dir (the one the runtime uses), atomically, and returns that
// file and whether it changed it. The list as it was is kept in a hidden
// backup next to it for Uninstall. Installing again changes nothing. It
// fails when dir holds no configuration, or when the first one is not a
// list (a single-plugin .conf cannot chain).
func Install(dir string, e Entry) (string, bool, error) {
	files, err := configFiles(dir)
	if err != nil {
		return "", false, err
	}
	if len(files) == 0 {
		return "", false, fmt.Errorf("no CNI network configuration in %s yet", dir)
	}
	path := files[0]
	st, err := os.Stat(path)
	if err != nil {
		return path, false, fmt.Errorf("install egressip-cni: %w", err)
	}
	cur, err := os.ReadFile(path)
	if err != nil {
		return path, false, fmt.Errorf("install egressip-cni: %w", err)
	}
	_, ps, err := parseList(cur)
	if err != nil {
		return path, false, fmt.Errorf("install egressip-cni into %s: %w", path, err)
	}
	if len(ps) > 0 && isOurs(ps[len(ps)-1]) && slices.IndexFunc(ps, isOurs) == len(ps)-1 {
		if got, _ := json.Marshal(ps[len(ps)-1]); bytes.Equal(got, mustJSON(e.json())) {
			return path, false, nil
		}
	}
	if !slices.ContainsFunc(ps, isOurs) {
		// The list as the CNI wrote it: what Uninstall restores.
		if err := writeAtomic(backupName(path), cur, st.Mode().Perm()); err != nil {
			return path, false, fmt.Errorf("install egressip-cni: back up: %w", err)
		}
	}
	next, err := withEntry(cur, &e)
	if err != nil {
		return path, false, fmt.Errorf("install egressip-cni into %s: %w", path, err)
	}
	if err := writeAtomic(path, next, st.Mode().Perm()); err != nil {
		return path, false, fmt.Errorf("install egressip-cni: %w", err)
	}
	return path, true, nil
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// Uninstall removes our entries from every configuration list in dir and
// returns the files it changed. A list that is exactly what Install made
// of its backup gets the backup back byte for byte; a list someone else
// changed since loses only our entry. Backups are removed.
func Uninstall(dir string) ([]string, error) {
	files, err := configFiles(dir)
	if err != nil {
		return nil, err
	}
	var changed []string
	var errs []error
	for _, path := range files {
		cur, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("uninstall egressip-cni: %w", err))
			continue
		}
		bk := backupName(path)
		_, ps, err := parseList(cur)
		if err != nil || !slices.ContainsFunc(ps, isOurs) {
			_ = os.Remove(bk)
			continue
		}
		st, err := os.Stat(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("uninstall egressip-cni: %w", err))
			continue
		}
		restore, err := withEntry(cur, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("uninstall egressip-cni from %s: %w", path, err))
			continue
		}
		if orig, err := os.ReadFile(bk); err == nil {
			// The backup is the original when our entry is all that
			// differs: their lists without our entry are equal.
			if o, err := withEntry(orig, nil); err == nil && bytes.Equal(o, restore) {
				restore = orig
			}
		}
		if err := writeAtomic(path, restore, st.Mode().Perm()); err != nil {
			errs = append(errs, fmt.Errorf("uninstall egressip-cni: %w", err))
			continue
		}
		_ = os.Remove(bk)
		changed = append(changed, path)
	}
	return changed, errors.Join(errs...)
}

// RunInstaller keeps e installed in dir while ctx runs: at once, then
// every period (a CNI that rewrites its list on restart drops our entry;
// a configuration that appears later is picked up). Errors are logged and
// retried; it returns nil when ctx ends.
func RunInstaller(ctx context.Context, dir string, e Entry, period time.Duration) error {
	logger := log.FromContext(ctx).WithName("cni-install")
	t := time.NewTicker(period)
	defer t.Stop()
	var lastErr string
	for {
		path, changed, err := Install(dir, e)
		switch {
		case err != nil && err.Error() != lastErr:
			logger.Error(err, "cannot install the egressip-cni plugin; Pods start unclassified until it is", "dir", dir)
			lastErr = err.Error()
		case err == nil && changed:
			conflistChanges.WithLabelValues("install").Inc()
			logger.Info("egressip-cni chained into the CNI configuration", "file", path)
			lastErr = ""
		case err == nil:
			lastErr = ""
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
