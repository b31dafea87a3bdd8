#!/usr/bin/env bash
# Checks (default) or applies (--fix) the repository's .clang-format to every
# C++ source and header under version control. The formatter is Debian 12's
# clang-format-14 (scripts/install-deps.sh installs it): other versions format
# some constructs differently, so the check insists on that one.
#   scripts/check-format.sh          exit 1 and list the files that differ
#   scripts/check-format.sh --fix    reformat them in place
# ctest runs the check as style.clang_format (tests/cmake/style.cmake).
set -euo pipefail
cd "$(dirname "$0")/.."
fmt=${CLANG_FORMAT:-clang-format-14}
if ! command -v "$fmt" >/dev/null; then
  echo "check-format: $fmt not found (scripts/install-deps.sh installs it)" >&2
  exit 2
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cc' '*.h')
else  # an exported tree without .git
  mapfile -t files < <(find include src bench tools tests python fuzz -name '*.cc' -o -name '*.h' 2>/dev/null | sort)
fi
if [[ "${1:-}" == "--fix" ]]; then
  "$fmt" -i "${files[@]}"
  echo "check-format: formatted ${#files[@]} files"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  # Output compared with the file, not --dry-run -Werror: clang-format 14 reports
  # a violation it does not fix on `}  // namespace megackpt::inline core`.
  "$fmt" "$f" | cmp -s - "$f" || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "check-format: ${#bad[@]} of ${#files[@]} files differ from .clang-format ($fmt):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "run scripts/check-format.sh --fix" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files match .clang-format"
