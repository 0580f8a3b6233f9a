{{- define "ec2tl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ec2tl.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "ec2tl.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "ec2tl.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ec2tl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ec2tl.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "ec2tl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ec2tl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ec2tl.labels" -}}
{{ include "ec2tl.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The image: by digest alone when one is given (what a release pins), else by tag. */}}
{{- define "ec2tl.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* The startup taint's key (`KEY[=VALUE]:EFFECT`), and its effect. */}}
{{- define "ec2tl.startupTaintKey" -}}
{{- splitList ":" .Values.config.startupTaint | first | splitList "=" | first -}}
{{- end -}}
{{- define "ec2tl.startupTaintEffect" -}}
{{- splitList ":" .Values.config.startupTaint | last -}}
{{- end -}}

{{/* The pods' tolerations: the user's, and the startup taint the controller releases (it must
run on a node still carrying it: on a new cluster every node may). Empty when there are none. */}}
{{- define "ec2tl.tolerations" -}}
{{- if or .Values.tolerations .Values.config.startupTaint -}}
tolerations:
{{- with .Values.tolerations }}
{{- toYaml . | nindent 2 }}
{{- end }}
{{- if .Values.config.startupTaint }}
  - key: {{ include "ec2tl.startupTaintKey" . | quote }}
    operator: Exists
{{- end }}
{{- end -}}
{{- end -}}

{{/* The Secret holding the verification records' key. */}}
{{- define "ec2tl.recordKeySecret" -}}
{{- .Values.recordKey.existingSecret | default (printf "%s-record-key" (include "ec2tl.fullname" .) | trunc 63 | trimSuffix "-") -}}
{{- end }}

{{/* The chart's record key, base64: the one in the cluster if there is one (and
`recordKey.rotation` has not moved past the Secret's), else a new one; made once per render (kept
in .Values), so that the Secret and the Deployment's checksum of it agree. */}}
{{- define "ec2tl.recordKey" -}}
{{- include "ec2tl.recordKeys" . -}}
{{- index .Values "ec2tlRenderedRecordKey" -}}
{{- end }}

{{/* The previous key, base64 ("" when none): the key a rotation replaced, which the controller
still opens records with (a rotation costs no EC2 call and no write). One rotation back only. */}}
{{- define "ec2tl.recordKeyPrevious" -}}
{{- include "ec2tl.recordKeys" . -}}
{{- index .Values "ec2tlRenderedRecordKeyPrevious" -}}
{{- end }}

{{- define "ec2tl.recordKeys" -}}
{{- if not (hasKey .Values "ec2tlRenderedRecordKey") -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "ec2tl.recordKeySecret" .) -}}
{{- $key := randAlphaNum 64 | b64enc -}}
{{- $previous := "" -}}
{{- if and $existing $existing.data (index $existing.data "key") -}}
{{- $annotations := $existing.metadata.annotations | default dict -}}
{{- $was := index $annotations "ec2-topology-labeler.io/rotation" | default "0" -}}
{{- if eq $was (toString .Values.recordKey.rotation) -}}
{{- $key = index $existing.data "key" -}}
{{- $previous = index $existing.data "previous" | default "" -}}
{{- else -}}
{{- $previous = index $existing.data "key" -}}
{{- end -}}
{{- end -}}
{{- $_ := set .Values "ec2tlRenderedRecordKey" $key -}}
{{- $_ := set .Values "ec2tlRenderedRecordKeyPrevious" $previous -}}
{{- end -}}
{{- end }}

{{/* What rolls the replicas when the record keys change (they are read at start): the
chart's Secret as rendered, or the existing Secret's data as the cluster holds it. */}}
{{- define "ec2tl.recordKeyChecksum" -}}
{{- if .Values.recordKey.existingSecret -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace .Values.recordKey.existingSecret -}}
{{- if and $existing $existing.data -}}
{{- toJson $existing.data | sha256sum -}}
{{- end -}}
{{- else -}}
{{- printf "%s/%s" (include "ec2tl.recordKey" .) (include "ec2tl.recordKeyPrevious" .) | sha256sum -}}
{{- end -}}
{{- end }}
