# fresh_venv VENV VAR: (re)creates the virtual environment VENV, sourced by chdb.sh and
# otelpy.sh, whose say and die it uses. It only ever removes a virtual environment (or
# nothing): VENV comes from the environment variable VAR and may point anywhere. Debian's
# python3 ships venv apart: as root it installs python3-venv when venv fails.
fresh_venv() {
  local venv=$1 var=$2
  command -v python3 >/dev/null || die "python3 not found: install Python 3.9 or later"
  if [[ -e "$venv" ]]; then
    [[ -f "$venv/pyvenv.cfg" ]] || die "$venv exists and is not a virtual environment: remove it or set $var"
    rm -rf "$venv"
  fi
  if ! python3 -m venv "$venv"; then
    command -v apt-get >/dev/null && [[ $(id -u) -eq 0 ]] || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
    say "installing Debian package python3-venv ..."
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv ||
      { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv; } ||
      die "apt-get install python3-venv failed"
    rm -rf "$venv"
    python3 -m venv "$venv" || die "python3 -m venv failed"
  fi
}
