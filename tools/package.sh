#!/usr/bin/env bash
# The .deb and the .rpm of the release binary (tools/release.sh calls this
# after building dist/preflight): the same files in both, at each family's
# paths, built with the distributions' own tools, dpkg-deb and rpmbuild
# (Debian's `rpm` package), from a staged tree; nothing is compiled here.
#
#   BIN       the binary to package (default dist/preflight)
#   OUT       where the packages go (default dist)
#   VERSION   the package version (default Cargo.toml's)
#   SETTINGS  the settings file to ship, commented out (default
#             contrib/slurm/settings.yaml; the tests ship a changed one)
#
# The man pages and completions come from the binary itself (`preflight
# man-pages`, `preflight completions`), so they describe the flags it has.
# SOURCE_DATE_EPOCH (default: the last commit's time) dates the changelog
# and the pages, so the same commit gives the same packages.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-dist/preflight}
out=${OUT:-dist}
field() { sed -n "s/^$1 = \"\(.*\)\"/\1/p" Cargo.toml | head -1; }
version=${VERSION:-$(field version)}
maintainer=$(sed -n 's/^authors = \["\(.*\)"\]/\1/p' Cargo.toml | head -1)
homepage=$(field homepage)
: "${maintainer:?Cargo.toml has no authors = [\"Name <address>\"]: the packages name a maintainer}"
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
[ -x "$bin" ] || { echo "tools/package.sh: no binary at $bin (run tools/release.sh)" >&2; exit 1; }
for tool in dpkg-deb rpmbuild; do
    command -v "$tool" >/dev/null || { echo "tools/package.sh: $tool is missing (apt install dpkg-dev rpm)" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

# The files both packages carry, at the paths they share.
common=$work/common
install -D -m755 "$bin" "$common/usr/bin/preflight"
# The settings as installed: every line commented out, so the file pins
# no value (a later default reaches an upgraded node) and an operator
# uncomments what to change.
install -d -m755 "$common/etc/preflight"
{
    echo "# Every setting below is at its default and commented out: uncomment a line"
    echo "# (a mode's whole block: a mode written here replaces its defaults) to change it."
    awk '{ if ($0 ~ /^[[:space:]]*#/ || $0 ~ /^[[:space:]]*$/) print; else print "# " $0 }' \
        "${SETTINGS:-contrib/slurm/settings.yaml}"
} > "$common/etc/preflight/settings.yaml"
chmod 644 "$common/etc/preflight/settings.yaml"
install -d -m755 "$common/etc/preflight/checks.d"
share=$common/usr/share/preflight
install -d -m755 "$share/slurm" "$share/kubernetes" "$share/prometheus"
for f in preflight-healthcheck preflight-prolog preflight-epilog; do
    # Packaged wrappers run the packaged binary.
    sed 's|PREFLIGHT=${PREFLIGHT:-/usr/local/bin/preflight}|PREFLIGHT=${PREFLIGHT:-/usr/bin/preflight}|' \
        "contrib/slurm/$f" > "$share/slurm/$f"
    grep -q 'PREFLIGHT:-/usr/bin/preflight}' "$share/slurm/$f" \
        || { echo "tools/package.sh: contrib/slurm/$f no longer sets PREFLIGHT as expected" >&2; exit 1; }
    chmod 755 "$share/slurm/$f"
done
install -m755 contrib/slurm/sbatch-example.sh "$share/slurm/"
install -m644 contrib/slurm/slurm.conf.fragment "$share/slurm/"
# The plain manifests, and the kustomize base with its overlays beneath.
git ls-files -z contrib/kubernetes | while IFS= read -r -d '' f; do
    install -D -m644 "$f" "$share/kubernetes/${f#contrib/kubernetes/}"
done
install -m644 contrib/prometheus/preflight-alerts.yml contrib/prometheus/preflight-alerts.test.yml "$share/prometheus/"
# The Ansible module and playbooks the repository tracks (no leftovers of
# a run: byte code, retry files). Not executable: Ansible reads a module and
# runs it on the managed host under that host's interpreter, so its
# `#!/usr/bin/python` is no dependency of this package.
git ls-files -z playbooks | while IFS= read -r -d '' f; do
    install -D -m644 "$f" "$share/ansible/${f#playbooks/}"
done
install -D -m644 contrib/systemd/preflight-check.service "$common/usr/lib/systemd/system/preflight-check.service"
install -D -m644 contrib/systemd/preflight-check.timer "$common/usr/lib/systemd/system/preflight-check.timer"
"$bin" man-pages "$work/man" >/dev/null
for page in "$work"/man/*.[15]; do
    section=${page##*.}
    install -d -m755 "$common/usr/share/man/man$section"
    gzip -9n < "$page" > "$common/usr/share/man/man$section/$(basename "$page").gz"
    chmod 644 "$common/usr/share/man/man$section/$(basename "$page").gz"
done
install -d -m755 "$common/usr/share/bash-completion/completions" "$common/usr/share/fish/vendor_completions.d"
"$bin" completions bash > "$common/usr/share/bash-completion/completions/preflight"
"$bin" completions fish > "$common/usr/share/fish/vendor_completions.d/preflight.fish"
"$bin" completions zsh > "$work/_preflight"
install -D -m644 README.md "$common/usr/share/doc/preflight/README.md"

summary=$(head -1 contrib/packaging/description.txt)
date_rfc2822=$(date -u -R -d "@$SOURCE_DATE_EPOCH")

# The .deb: Debian's paths for zsh, compressed docs, copyright and
# changelog, conffiles, md5sums.
deb=$work/deb
cp -a "$common" "$deb"
install -D -m644 "$work/_preflight" "$deb/usr/share/zsh/vendor-completions/_preflight"
gzip -9n "$deb/usr/share/doc/preflight/README.md"
install -m644 contrib/packaging/copyright "$deb/usr/share/doc/preflight/copyright"
printf 'preflight (%s) unstable; urgency=medium\n\n  * Release %s (README.md.gz in this directory).\n\n -- %s  %s\n' \
    "$version" "$version" "$maintainer" "$date_rfc2822" | gzip -9n > "$deb/usr/share/doc/preflight/changelog.gz"
install -D -m644 contrib/packaging/lintian-overrides "$deb/usr/share/lintian/overrides/preflight"
install -d -m755 "$deb/DEBIAN"
for script in postinst prerm postrm; do
    install -m755 "contrib/packaging/$script" "$deb/DEBIAN/$script"
done
echo /etc/preflight/settings.yaml > "$deb/DEBIAN/conffiles"
(cd "$deb" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum) > "$deb/DEBIAN/md5sums"
{
    echo "Package: preflight"
    echo "Version: $version"
    echo "Architecture: amd64"
    echo "Maintainer: $maintainer"
    echo "Installed-Size: $(du -sk --exclude=DEBIAN "$deb" | cut -f1)"
    echo "Depends: libc6 (>= 2.17)"
    echo "Section: admin"
    echo "Priority: optional"
    [ -n "$homepage" ] && echo "Homepage: $homepage"
    echo "Description: $summary"
    tail -n +2 contrib/packaging/description.txt | sed 's/^/ /'
} > "$deb/DEBIAN/control"
find "$deb" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
deb_file=$out/preflight_${version}_amd64.deb
dpkg-deb --root-owner-group -Zxz --build "$deb" "$deb_file" >/dev/null

# The .rpm: Red Hat's path for zsh, the licence where %license puts it.
rpm=$work/rpm
cp -a "$common" "$rpm"
install -D -m644 "$work/_preflight" "$rpm/usr/share/zsh/site-functions/_preflight"
install -D -m644 LICENSE "$rpm/usr/share/licenses/preflight/LICENSE"
top=$work/rpmbuild
mkdir -p "$top"
# The long description goes into the spec itself: a macro defined on the
# command line ends at its first newline.
spec=$work/preflight.spec
tail -n +2 contrib/packaging/description.txt | sed 's/^\.$//' > "$work/description"
awk -v file="$work/description" '$0 == "@DESCRIPTION@" { while ((getline line < file) > 0) print line; next } { print }' \
    contrib/packaging/preflight.spec > "$spec"
rpmbuild -bb --quiet \
    --define "_topdir $top" \
    --define "_rpmdir $top/RPMS" \
    --define "pf_version ${version//-/_}" \
    --define "pf_summary $summary" \
    --define "pf_stage $rpm" \
    ${homepage:+--define "pf_homepage $homepage"} \
    --define '__os_install_post %{nil}' \
    --define '_build_id_links none' \
    --define 'use_source_date_epoch_as_buildtime 1' \
    --define 'clamp_mtime_to_source_date_epoch 1' \
    --target x86_64-linux \
    "$spec" >/dev/null
rpm_file=$out/preflight-${version//-/_}-1.x86_64.rpm
mv "$top"/RPMS/x86_64/*.rpm "$rpm_file"
echo "$deb_file"
echo "$rpm_file"
