{{- /*
What the binary refuses when it starts (each flag's range, declared beside it and listed in src/cmd/mod.rs BOUNDS; the checks across flags,
`RunArgs::check` in src/flags/mod.rs), refused here when the chart renders: a value that would
crash-loop the controller fails `helm install`, `helm upgrade` and `helm template` instead, with
the binary's reason. The schema (values.schema.json) already checks each value's form and the
ranges of counts and numbers; durations and combinations are checked here. A test renders the
chart and runs the binary's own check on the same values, and holds the two to the same answers
(e2e/suite/tests/chart.rs, `the_chart_refuses_what_the_binary_refuses`). `extraArgs` are the
binary's alone to check.
*/ -}}

{{- /* A duration as the binary reads it (humantime; the schema has checked its form: numbers,
a fraction of up to 6 digits, units), in nanoseconds, as a float: exact below 2^53 ns (104 days),
far above every maximum, and anything larger is refused as out of range all the same. Prints
"invalid" for what the binary cannot read at all: a fraction that is not a whole number of
nanoseconds (of seconds from an hour up). */ -}}
{{- define "ec2tl.nanos" -}}
{{- $unit := dict "nanos" "ns" "nsec" "ns" "ns" "ns" "usec" "us" "us" "us" "µs" "us" "millis" "ms" "msec" "ms" "ms" "ms" "seconds" "s" "second" "s" "secs" "s" "sec" "s" "s" "s" "minutes" "m" "minute" "m" "mins" "m" "min" "m" "m" "m" "hours" "h" "hour" "h" "hrs" "h" "hr" "h" "h" "h" "days" "d" "day" "d" "d" "d" "weeks" "w" "week" "w" "wks" "w" "wk" "w" "w" "w" "months" "M" "month" "M" "M" "M" "years" "y" "year" "y" "yrs" "y" "yr" "y" "y" "y" }}
{{- /* Nanoseconds in one unit; a fraction of a unit from an hour up counts in whole seconds
(seconds in one unit), below it in whole nanoseconds, as humantime counts them. */ -}}
{{- $ns := dict "ns" 1 "us" 1000 "ms" 1000000 "s" 1000000000 "m" 60000000000 "h" 3600000000000 "d" 86400000000000 "w" 604800000000000 "M" 2630016000000000 "y" 31557600000000000 }}
{{- $secs := dict "h" 3600 "d" 86400 "w" 604800 "M" 2630016 "y" 31557600 }}
{{- $total := 0.0 }}
{{- $invalid := false }}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)? *[a-zA-Zµ]+" (toString .) -1 }}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" . }}
{{- $u := get $unit (trim (trimPrefix $number .)) }}
{{- $whole := regexFind "^[0-9]+" $number }}
{{- $total = addf $total (mulf (float64 $whole) (get $ns $u)) }}
{{- $fraction := trimPrefix "." (trimPrefix $whole $number) }}
{{- if $fraction }}
{{- /* Leading zeros off: int64 would read "07" as octal. */ -}}
{{- $n := int64 (regexReplaceAll "^0+" $fraction "" | default "0") }}
{{- $d := int64 (printf "1%s" (repeat (len $fraction) "0")) }}
{{- /* In whole seconds from an hour up, whole nanoseconds below; else humantime refuses it. */ -}}
{{- $per := get $ns $u }}
{{- if hasKey $secs $u }}{{ $per = get $secs $u }}{{ end }}
{{- if or (eq $u "ns") (ne (mod (mul $n $per) $d) 0) }}
{{- $invalid = true }}
{{- else if hasKey $secs $u }}
{{- $total = addf $total (mulf (div (mul $n $per) $d) 1000000000) }}
{{- else }}
{{- $total = addf $total (div (mul $n $per) $d) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $invalid }}invalid{{ else }}{{ $total }}{{ end }}
{{- end }}

{{- /* Refuses a duration outside its range: (dict "key" "config.cacheTtl" "value" "31d"
"bound" (the bound from ec2tl.durationBounds)). */ -}}
{{- define "ec2tl.checkDuration" -}}
{{- $nanos := include "ec2tl.nanos" .value }}
{{- if eq $nanos "invalid" }}
{{- fail (printf "%s: %q is not a duration the controller reads: a fraction must come to whole nanoseconds (whole seconds from an hour up)" .key (toString .value)) }}
{{- end }}
{{- if or (lt (float64 $nanos) (float64 .bound.min)) (gt (float64 $nanos) (float64 .bound.max)) }}
{{- fail (printf "%s: %q is out of range for --%s: %s (the controller would refuse it and never start)" .key (toString .value) .bound.flag .bound.range) }}
{{- end }}
{{- end }}

{{- /* A label key as Kubernetes takes it: an optional DNS-subdomain prefix of at most 253
characters and `/`, then a name of 1 to 63 characters. Prints "true" or nothing. */ -}}
{{- define "ec2tl.validLabelKey" -}}
{{- $name := regexReplaceAll "^.*/" . "" }}
{{- $prefix := "" }}
{{- if contains "/" . }}{{ $prefix = regexReplaceAll "/[^/]*$" . "" }}{{ end }}
{{- $segment := "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$" }}
{{- $ok := regexMatch "^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$" $name }}
{{- if contains "/" . }}
{{- $ok = and $ok (le (len $prefix) 253) (gt (len $prefix) 0) }}
{{- range splitList "." $prefix }}
{{- $ok = and $ok (regexMatch $segment .) }}
{{- end }}
{{- end }}
{{- if $ok }}true{{ end }}
{{- end }}

{{- define "ec2tl.checks" -}}
{{- $bounds := include "ec2tl.durationBounds" . | fromJson }}
{{- range $key, $value := .Values.config }}
{{- with get $bounds (printf "config.%s" $key) }}
{{- include "ec2tl.checkDuration" (dict "key" (printf "config.%s" $key) "value" $value "bound" .) }}
{{- end }}
{{- end }}
{{- $le := .Values.leaderElection }}
{{- /* The uninstall hook passes the lease duration and its own wait whether or not the
controller elects a leader: a value its Job would refuse fails the install, not the uninstall. */ -}}
{{- if .Values.uninstallHook.enabled }}
{{- include "ec2tl.checkDuration" (dict "key" "uninstallHook.waitForLease" "value" .Values.uninstallHook.waitForLease "bound" (get $bounds "uninstallHook.waitForLease")) }}
{{- include "ec2tl.checkDuration" (dict "key" "leaderElection.leaseDuration" "value" $le.leaseDuration "bound" (get $bounds "leaderElection.leaseDuration")) }}
{{- end }}
{{- if $le.enabled }}
{{- range $key := list "leaseDuration" "renewGrace" }}
{{- include "ec2tl.checkDuration" (dict "key" (printf "leaderElection.%s" $key) "value" (get $le $key) "bound" (get $bounds (printf "leaderElection.%s" $key))) }}
{{- end }}
{{- /* The Lease counts whole seconds; the grace is shorter than the lease; the renew deadline
(lease − grace) holds 3 renewal attempts a retry period apart (half the grace, 200ms to 2s),
and one more period for the last to finish (src/leader/mod.rs, Timings::from_args). */ -}}
{{- $d := divf (float64 (include "ec2tl.nanos" $le.leaseDuration)) 1000000000 }}
{{- $g := divf (float64 (include "ec2tl.nanos" $le.renewGrace)) 1000000000 }}
{{- if or (ne (floor $d) $d) (ne (floor $g) $g) }}
{{- fail (printf "leaderElection: the lease duration (%s) and renew grace (%s) must be whole seconds, at least 1s" $le.leaseDuration $le.renewGrace) }}
{{- end }}
{{- if ge $g $d }}
{{- fail (printf "leaderElection: the renew grace (%s) must be shorter than the lease duration (%s)" $le.renewGrace $le.leaseDuration) }}
{{- end }}
{{- $retry := maxf 0.2 (minf 2.0 (divf $g 2)) }}
{{- if lt (subf $d $g) (mulf $retry 4) }}
{{- fail (printf "leaderElection: the renew deadline (leaseDuration %s − renewGrace %s) must hold 3 renewal attempts, each a retry period (%vs: half the grace, at most 2s) after the last and given one to finish: lengthen leaseDuration to at least %vs or shorten renewGrace" $le.leaseDuration $le.renewGrace $retry (ceil (addf $g (mulf $retry 4)))) }}
{{- end }}
{{- end }}
{{- /* The label keys as a whole (src/flags/scheme.rs, LabelArgs::scheme; crates/core LabelScheme::validate). */ -}}
{{- $c := .Values.config }}
{{- $preset := $c.labelPreset | default "eks" }}
{{- $eksPrefix := "topology.k8s.aws/network-node-layer-" }}
{{- $defaultBlock := "ec2-topology-labeler.io/capacity-block-id" }}
{{- /* A key set to "" is passed as "" (and refused as a label key): hasKey, not default. */ -}}
{{- $prefix := ternary $c.layerLabelPrefix $eksPrefix (hasKey $c "layerLabelPrefix") }}
{{- $numbering := $c.layerNumbering | default "top-first" }}
{{- $first := 1 }}
{{- $block := ternary $c.capacityBlockLabelKey $defaultBlock (hasKey $c "capacityBlockLabelKey") }}
{{- if eq $preset "hyperpod" }}
{{- if eq $block $defaultBlock }}{{ $block = "topology.k8s.aws/ultraserver-id" }}{{ end }}
{{- else if eq $preset "topograph" }}
{{- if eq $prefix $eksPrefix }}{{ $prefix = "fabric.topograph.run/tier-" }}{{ end }}
{{- if eq $block $defaultBlock }}{{ $block = "accelerator.topograph.run/domain" }}{{ end }}
{{- $numbering = "leaf-first" }}
{{- $first = 0 }}
{{- end }}
{{- $extras := list }}
{{- if ne (toString $c.zoneIdLabel) "false" }}{{ $extras = append $extras (ternary $c.zoneIdLabelKey "topology.k8s.aws/zone-id" (hasKey $c "zoneIdLabelKey")) }}{{ end }}
{{- if ne (toString $c.capacityBlockLabel) "false" }}{{ $extras = append $extras $block }}{{ end }}
{{- if ne (toString $c.placementGroupLabel) "false" }}{{ $extras = append $extras (ternary $c.placementGroupLabelKey "ec2-topology-labeler.io/placement-group" (hasKey $c "placementGroupLabelKey")) }}{{ end }}
{{- range prepend $extras (printf "%s%d" $prefix (add 16 $first -1)) }}
{{- if not (include "ec2tl.validLabelKey" .) }}
{{- fail (printf "config: %q is not a valid label key (the layer keys are layerLabelPrefix and a number up to 16)" .) }}
{{- end }}
{{- end }}
{{- range $i, $key := $extras }}
{{- $layer := trimPrefix $prefix $key }}
{{- $isLayer := and (hasPrefix $prefix $key) (regexMatch "^(0|[1-9][0-9]?)$" $layer) }}
{{- if $isLayer }}{{ $n := add (atoi $layer) 1 (mul $first -1) }}{{ $isLayer = and (ge $n 1) (le $n 16) }}{{ end }}
{{- if or $isLayer (has $key (slice $extras (add $i 1))) }}
{{- fail (printf "config: label key %q is used twice" $key) }}
{{- end }}
{{- end }}
{{- if and (eq (toString $c.ultraserverLevel) "always") (eq (toString $c.capacityBlockLabel) "false") }}
{{- fail "config: ultraserverLevel always needs the capacity block label (capacityBlockLabel true): the UltraServer level is that label" }}
{{- end }}
{{- if and (eq (toString $c.nvlinkCliqueLevel) "true") (or (eq (toString $c.ultraserverLevel) "never") (eq (toString $c.capacityBlockLabel) "false")) }}
{{- fail "config: nvlinkCliqueLevel puts the NVLink clique under the UltraServer level: it needs ultraserverLevel auto or always and the capacity block label (capacityBlockLabel true)" }}
{{- end }}
{{- if and (eq (toString $c.ultraserverHealthTaint) "true") (ne (toString $c.ultraserverHealth) "true") }}
{{- fail "config: ultraserverHealthTaint needs ultraserverHealth true" }}
{{- end }}
{{- if and (eq (toString $c.ultraserverHealth) "true") (eq (toString $c.capacityBlockLabel) "false") }}
{{- fail "config: ultraserverHealth needs the capacity block label (capacityBlockLabel true): its members are the nodes carrying it" }}
{{- end }}
{{- if and (eq (toString $c.ultraserverShape) "true") (eq (toString $c.capacityBlockLabel) "false") }}
{{- fail "config: ultraserverShape needs the capacity block label (capacityBlockLabel true): its members are the nodes carrying it" }}
{{- end }}
{{- if and (hasKey $c "uniformDepth") (ne $numbering "top-first") }}
{{- fail "config: uniformDepth needs top-first layer numbering (with leaf-first, layer 1 is already the switch above every node; the topograph preset numbers leaf-first)" }}
{{- end }}
{{- /* Slinky's annotation names its topologies: non-empty, without ':', ',' or spaces. */ -}}
{{- if eq (toString $c.slinkyAnnotation) "true" }}
{{- $names := list (ternary $c.slurmTopologyName "topo-switch" (hasKey $c "slurmTopologyName")) }}
{{- if hasKey $c "slinkyBlockTopology" }}{{ $names = append $names $c.slinkyBlockTopology }}{{ end }}
{{- range $names }}
{{- if or (eq (toString .) "") (regexMatch "[:, ]" (toString .)) }}
{{- fail (printf "config: Slurm topology name %q must be non-empty, without ':', ',' or spaces" (toString .)) }}
{{- end }}
{{- end }}
{{- end }}
{{- with $c.slurmTopologyConfigmap }}
{{- $dns := "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$" }}
{{- $parts := splitList "/" . }}
{{- $ns := index $parts 0 }}
{{- if not (and (eq (len $parts) 2) (regexMatch $dns $ns) (le (len $ns) 63) (not (contains "." $ns)) (regexMatch $dns (index $parts 1)) (le (len (index $parts 1)) 253)) }}
{{- fail (printf "config.slurmTopologyConfigmap: %q is not NAMESPACE/NAME (lowercase DNS names)" .) }}
{{- end }}
{{- end }}
{{- end }}
