# shellcheck shell=bash
# ci_mounts: `-v DIR:DIR:ro` for each local package folder this host's pip settings name
# (file:// indexes, find-links), so pip inside a build reads them as the host does.
ci_mounts() {
  pip config list 2>/dev/null | grep -oE "(file://)?/[^' ]+" | sed 's#^file://##' \
    | while read -r path; do
        [ -d "$path" ] || continue
        top=/$(echo "$path" | cut -d/ -f2-3)
        echo "$top"
      done | sort -u | while read -r top; do printf -- '-v %s:%s:ro ' "$top" "$top"; done
}
