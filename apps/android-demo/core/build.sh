#!/usr/bin/env bash
# Build and test the pure-Java core with the JDK alone: javac, then JUnit 4 from Debian's junit4
# package (installed by scripts/setup.sh). No Gradle, nothing downloaded.
#
#   core/build.sh compile            compile src/main (Java 8 API level, as Android needs)
#   core/build.sh build              compile src/main and src/test
#   core/build.sh junit [-Dk=v ...]  run every *Test class with JUnitCore (after build); -D system
#                                    properties reach the tests (edgesplit.url, ... see LiveServerTest)
#   core/build.sh test [-Dk=v ...]   build, then junit
#   core/build.sh jar                compile, then build/edgesplit-core.jar
#
# BUILD_DIR (default core/build) is where classes go; JUNIT_JAR and HAMCREST_JAR override the jars.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${BUILD_DIR:-$here/build}
cmd=${1:-test}
[ $# -gt 0 ] && shift
junit=${JUNIT_JAR:-/usr/share/java/junit4.jar}
hamcrest=${HAMCREST_JAR:-/usr/share/java/hamcrest-core.jar}
# --release 8 keeps the core to the Java 8 API, which Android (minSdk 26) has.
JAVAC=(javac --release 8 -encoding UTF-8 -Xlint:all,-options -Werror)

compile_main() {
  rm -rf "$out/classes" && mkdir -p "$out/classes"
  find "$here/src/main/java" -name '*.java' > "$out/main-sources.txt"
  "${JAVAC[@]}" -d "$out/classes" @"$out/main-sources.txt"
}

compile_tests() {
  for jar in "$junit" "$hamcrest"; do
    [ -f "$jar" ] || { echo "build.sh: $jar is missing (apt-get install junit4, or bash scripts/setup.sh)" >&2; exit 3; }
  done
  rm -rf "$out/test-classes" && mkdir -p "$out/test-classes"
  find "$here/src/test/java" -name '*.java' > "$out/test-sources.txt"
  "${JAVAC[@]}" -cp "$out/classes:$junit:$hamcrest" -d "$out/test-classes" @"$out/test-sources.txt"
}

run_junit() {
  [ -d "$out/test-classes" ] || { echo "build.sh: no $out/test-classes; run build.sh build first" >&2; exit 3; }
  classes=$(cd "$out/test-classes" && find . -name '*Test.class' ! -name '*$*' | sed 's|^\./||; s|\.class$||; s|/|.|g' | sort)
  # shellcheck disable=SC2086  # one argument per class
  exec java "$@" -cp "$out/classes:$out/test-classes:$junit:$hamcrest" org.junit.runner.JUnitCore $classes
}

case "$cmd" in
  compile)
    compile_main ;;
  jar)
    compile_main
    jar cf "$out/edgesplit-core.jar" -C "$out/classes" . ;;
  build)
    compile_main
    compile_tests ;;
  junit)
    run_junit "$@" ;;
  test)
    compile_main
    compile_tests
    run_junit "$@" ;;
  *)
    echo "usage: build.sh [compile|build|junit|test|jar] [-Dkey=value ...]" >&2; exit 2 ;;
esac
