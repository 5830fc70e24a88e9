#!/usr/bin/env bash
# deps_test.sh ROOT: the set-up scripts' dependency check (scripts/deps.sh)
# names what is missing and nothing that is here, so that the demo can say
# what the test command will install. Last line: PASS or FAIL.
set -u
# shellcheck source=scripts/deps.sh
. "$1/scripts/deps.sh"
got=$(ca_missing_deps python3 no-such-cudalloc-package cmake also-not-here)
want="no-such-cudalloc-package also-not-here"
[[ $got == "$want" ]] || { echo "FAIL deps: missing '$got', want '$want'"; exit 1; }
none=$(ca_missing_deps python3 cmake)
[[ -z $none ]] || { echo "FAIL deps: '$none' said missing, though here"; exit 1; }
for pkg in $CA_TEST_DEPS; do
  [[ $pkg =~ ^[a-z0-9.+-]+$ ]] || { echo "FAIL deps: '$pkg' is no package name"; exit 1; }
done
echo "PASS deps: the missing named, the present not; test dependencies: $CA_TEST_DEPS"
