# Sourced by the bench scripts: the preflight binary to measure. BIN when
# set (CI's short run passes the release binary tools/release.sh built,
# dist/preflight), else a release build made here.
preflight_bin() {
    if [[ -n ${BIN:-} ]]; then
        realpath "$BIN"
    else
        cargo build --release --quiet >&2
        echo "$PWD/target/release/preflight"
    fi
}
