#!/usr/bin/env python3
"""ClickHouse 26.9 (the chdb-core package) as a line-oriented engine for bandplane's
tests (deploy/stacktest/dual): test-only. Reads one JSON request per line on stdin,
writes one JSON reply per line on stdout.

  {"op": "query", "sql": "SELECT ..."}       -> {"ok": true, "out": "<TSVWithNamesAndTypes>"}
  {"op": "exec", "sql": "CREATE ..."}        -> {"ok": true}
  {"op": "insert", "sql": "INSERT INTO db.t (a, b)", "data": "<TabSeparated rows>"}
  any failure                                -> {"ok": false, "error": "Code: ... DB::Exception: ..."}

The session lives in the folder given as the first argument (the caller removes it).
"""
import json
import sys

from chdb import session


def main():
    s = session.Session(sys.argv[1])
    # 18.16 writes every digit of a Decimal's scale (1.500000); current releases drop
    # the trailing zeros unless told not to. Same text on both, nothing to normalise.
    s.query("SET output_format_decimal_trailing_zeros = 1")
    out = sys.stdout
    version = s.query("SELECT version()", "TabSeparated").bytes().decode().strip()
    out.write(json.dumps({"ok": True, "out": version}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            op = req["op"]
            if op == "query":
                res = s.query(req["sql"], "TabSeparatedWithNamesAndTypes")
                reply = {"ok": True, "out": res.bytes().decode("utf-8", "surrogateescape")}
            elif op == "exec":
                s.query(req["sql"], "TabSeparated")
                reply = {"ok": True}
            elif op == "insert":
                s.query(req["sql"] + " FORMAT TabSeparated\n" + req["data"], "TabSeparated")
                reply = {"ok": True}
            else:
                reply = {"ok": False, "error": "unknown op %r" % op}
        except Exception as e:  # the engine's errors go back to the test, verbatim
            reply = {"ok": False, "error": str(e)}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    s.close()


if __name__ == "__main__":
    main()
