#!/usr/bin/env bash
# Build and test the pure-Java core with the JDK alone: javac, Gson from Debian's libgoogle-gson-java
# and JUnit 4 from Debian's junit4 (scripts/setup.sh installs both). No Gradle, nothing downloaded.
# (Gradle builds take Gson from Maven Central instead: core/build.gradle pins the same version.)
#
#   core/build.sh compile            compile src/main (Java 8 API level, as Android needs)
#   core/build.sh build              compile src/main and src/test
#   core/build.sh junit [-Dk=v ...]  run every *Test class with JUnitCore (after build); -D system
#                                    properties reach the tests (edgesplit.url, ... see LiveServerTest)
#   core/build.sh test [-Dk=v ...]   build, then junit
#   core/build.sh jar                compile, then build/edgesplit-core.jar
#   core/build.sh classpath          print the classpath that runs the compiled core (classes + Gson)
#
# BUILD_DIR (default core/build) is where classes go; GSON_JAR, JUNIT_JAR and HAMCREST_JAR override
# the jars.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${BUILD_DIR:-$here/build}
cmd=${1:-test}
[ $# -gt 0 ] && shift
gson=${GSON_JAR:-/usr/share/java/gson.jar}
junit=${JUNIT_JAR:-/usr/share/java/junit4.jar}
hamcrest=${HAMCREST_JAR:-/usr/share/java/hamcrest-core.jar}
# --release 8 keeps the core to the Java 8 API, which Android (minSdk 26) has.
JAVAC=(javac --release 8 -encoding UTF-8 -Xlint:all,-options -Werror)

need_jar() {
  [ -f "$1" ] || { echo "build.sh: $1 is missing (apt-get install $2, or bash scripts/setup.sh)" >&2; exit 3; }
}

compile_main() {
  need_jar "$gson" libgoogle-gson-java
  rm -rf "$out/classes" && mkdir -p "$out/classes"
  find "$here/src/main/java" -name '*.java' > "$out/main-sources.txt"
  "${JAVAC[@]}" -cp "$gson" -d "$out/classes" @"$out/main-sources.txt"
}

compile_tests() {
  need_jar "$junit" junit4
  need_jar "$hamcrest" junit4
  rm -rf "$out/test-classes" && mkdir -p "$out/test-classes"
  find "$here/src/test/java" -name '*.java' > "$out/test-sources.txt"
  "${JAVAC[@]}" -cp "$out/classes:$gson:$junit:$hamcrest" -d "$out/test-classes" @"$out/test-sources.txt"
}

run_junit() {
  [ -d "$out/test-classes" ] || { echo "build.sh: no $out/test-classes; run build.sh build first" >&2; exit 3; }
  classes=$(cd "$out/test-classes" && find . -name '*Test.class' ! -name '*$*' | sed 's|^\./||; s|\.class$||; s|/|.|g' | sort)
  # shellcheck disable=SC2086  # one argument per class
  exec java "$@" -cp "$out/classes:$gson:$out/test-classes:$junit:$hamcrest" org.junit.runner.JUnitCore $classes
}

case "$cmd" in
  compile)
    compile_main ;;
  classpath)
    echo "$out/classes:$gson" ;;
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
    echo "usage: build.sh [compile|build|junit|test|jar|classpath] [-Dkey=value ...]" >&2; exit 2 ;;
esac
