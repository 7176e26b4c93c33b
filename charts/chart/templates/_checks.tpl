{{/*
Hand-written (not from the kubebuilder plugin): render-time checks of
values that the values schema cannot express because they relate several
values. templates/checks.yaml runs them.
*/}}

{{/*
egressip.durationMs: the Go duration string given (e.g. "1m30s", "250ms")
in milliseconds, as a float. Only the units of Go's time.ParseDuration are
summed; the values schema has already refused any other shape.
*/}}
{{- define "egressip.durationMs" -}}
{{- $units := dict "ns" 0.000001 "us" 0.001 "µs" 0.001 "ms" 1.0 "s" 1000.0 "m" 60000.0 "h" 3600000.0 -}}
{{- $total := 0.0 -}}
{{- range (regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h)" (toString .) -1) -}}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" . | float64 -}}
{{- $unit := regexReplaceAll "^[0-9]+(\\.[0-9]+)?" . "" -}}
{{- $total = addf $total (mulf $num (get $units $unit)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
egressip.checkLeaderElection fails the render on controller.leaderElection
values that egressip-controller refuses at start
(LeaderElectionConfig.Check in internal/controller/leaderelection.go): a
lease duration that is not whole seconds (the Lease stores
leaseDurationSeconds) or not above renewDeadline + retryPeriod, a renew
deadline not above 1.2 x retryPeriod (client-go's rule).
*/}}
{{- define "egressip.checkLeaderElection" -}}
{{- $le := .Values.controller.leaderElection -}}
{{- $lease := include "egressip.durationMs" $le.leaseDuration | float64 -}}
{{- $renew := include "egressip.durationMs" $le.renewDeadline | float64 -}}
{{- $retry := include "egressip.durationMs" $le.retryPeriod | float64 -}}
{{- if or (lt $lease 1000.0) (ne (mod (int64 $lease) 1000) 0) (ne $lease (float64 (int64 $lease))) -}}
{{- fail (printf "controller.leaderElection.leaseDuration %v must be a whole number of seconds, at least 1s (the Lease stores whole seconds)" $le.leaseDuration) -}}
{{- end -}}
{{- if or (le $renew 0.0) (le $retry 0.0) -}}
{{- fail (printf "controller.leaderElection.renewDeadline %v and retryPeriod %v must be positive" $le.renewDeadline $le.retryPeriod) -}}
{{- end -}}
{{- if le $renew (mulf 1.2 $retry) -}}
{{- fail (printf "controller.leaderElection.renewDeadline %v must be more than 1.2 x retryPeriod %v (client-go's rule)" $le.renewDeadline $le.retryPeriod) -}}
{{- end -}}
{{- if le $lease (addf $renew $retry) -}}
{{- fail (printf "controller.leaderElection.leaseDuration %v must be more than renewDeadline %v + retryPeriod %v" $le.leaseDuration $le.renewDeadline $le.retryPeriod) -}}
{{- end -}}
{{- end -}}
