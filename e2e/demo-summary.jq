# The demos' summary of `kubectl get ra -o json` (make demo and make demo-processes): attempts by
# state, then each started attempt's launch steps.
[.items[] | .status // {}] as $s
| "attempts: \($s | length); by state: \($s | group_by(.state) | map("\(.[0].state)=\(length)") | join(" "))",
  "launch (ms, per attempt that started): materialize/prepare/register/spawn",
  ($s[] | select(.launch) | "  \(.launch.materializeMs // "-")/\(.launch.prepareMs // "-")/\(.launch.registerMs // "-")/\(.launch.spawnMs // "-") package downloaded: \(.launch.packageDownloaded // false)")
