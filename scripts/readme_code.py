#!/usr/bin/env python3
"""Keeps README.md's code and paths true (the CTests readme_code and readme_paths).

  readme_code.py generate README.md OUT.cpp   # the C++ blocks as one program (built by CMake, then run)
  readme_code.py check README.md REPO_DIR     # excerpts and paths

Every ```cpp block follows a marker line saying how it is checked:
  <!-- readme-check: run -->          the block is the body of a function that the program calls (the tour)
  <!-- readme-check: compile (PARAMS) -->  the body of a function with these parameters, compiled, never called
                                       (the names a fragment uses without declaring them)
  <!-- readme-check: excerpt FILE -->  every line of the block (comments and whitespace aside) appears in FILE,
                                       in order; `// ...` marks what the excerpt leaves out
`check` also refuses a path outside the repository (`../...`), and checks that each path the README names in
backquotes (`examples/...`, `scripts/...`, `bench/...`, `tests/...`, `build/<preset>/...`) exists or, under
build/, names a CMake preset and a target the project builds. Exits 1 naming the line of each fault, 2 on bad
usage.
"""
import json, os, re, sys

MARKER = re.compile(r"<!--\s*readme-check:\s*(run|compile|excerpt)\s*(.*?)\s*-->")


def blocks(text):
    """(line number, marker kind, marker argument, code) of each ```cpp block."""
    lines = text.split("\n")
    out, i, marker = [], 0, None
    while i < len(lines):
        m = MARKER.search(lines[i])
        if m:
            marker = (m.group(1), m.group(2), i + 1)
        if lines[i].strip() == "```cpp":
            start = i + 1
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            kind, arg, at = marker if marker and marker[2] >= start - 3 else (None, None, None)
            out.append((start, kind, arg, "\n".join(lines[start:j])))
            marker, i = None, j
        i += 1
    return out


def generate(readme, out_path):
    text = open(readme, encoding="utf-8").read()
    body = ["// Generated from README.md by scripts/readme_code.py: its C++ blocks, each a function.",
            "#include <cstdio>", "#include <memory>", "#include <vector>",
            "#include <pmap/pmap.h>", "#include <pmap/distributed.h>",
            "#include <pmapcc/core/grad.h>", "#include <pmapcc/core/ops.h>",
            "#include <pmapcc/nn/parallel.h>", "#include <pmapcc/optim/optim.h>", "#include <pmapcc/train/trainer.h>",
            ""]
    runs, faults = [], []
    for line, kind, arg, code in blocks(text):
        if kind is None:
            faults.append(f"README.md:{line}: a ```cpp block without a <!-- readme-check: ... --> marker")
        elif kind == "run":
            body += [f"void readme_block_{line}() {{", f'#line {line + 1} "README.md"', code, "}", ""]
            runs.append(line)
        elif kind == "compile":
            params = arg.strip()
            if not (params.startswith("(") and params.endswith(")")):
                params = "()"
            body += [f"[[maybe_unused]] void readme_block_{line}{params} {{", f'#line {line + 1} "README.md"', code, "}",
                     ""]
    body += ["int main() {"]
    for line in runs:
        body += [f'  std::printf("README.md:{line}: running the block\\n");', f"  readme_block_{line}();"]
    body += ['  std::printf("README.md: every run block ran\\n");', "  return 0;", "}", ""]
    if faults:
        sys.exit("\n".join(faults))
    new = "\n".join(body)
    if not os.path.exists(out_path) or open(out_path).read() != new:
        with open(out_path, "w") as f:
            f.write(new)


def normalized(code):
    """Each line without // comments and whitespace; empty lines dropped."""
    out = []
    for l in code.split("\n"):
        l = re.sub(r"//.*", "", l)
        l = re.sub(r"\s+", "", l)
        if l:
            out.append(l)
    return out


def check(readme, repo):
    text = open(readme, encoding="utf-8").read()
    faults = []
    presets = {p["name"] for p in json.load(open(os.path.join(repo, "CMakePresets.json")))["configurePresets"]}
    for line, kind, arg, code in blocks(text):
        if kind != "excerpt":
            continue
        path = os.path.join(repo, arg)
        if not os.path.isfile(path):
            faults.append(f"README.md:{line}: excerpt of {arg}, which does not exist")
            continue
        whole = "".join(normalized(open(path, encoding="utf-8").read()))
        at = 0
        for l in normalized(code):
            found = whole.find(l, at)
            if found < 0:
                faults.append(f"README.md:{line}: not in {arg} (after what came before): {l}")
                break
            at = found + len(l)
    for n, l in enumerate(text.split("\n"), 1):
        for p in re.findall(r"`([^`\s]+)`", l):
            if p.startswith("../"):
                faults.append(f"README.md:{n}: {p} is outside the repository (a user's clone does not have it)")
            elif p.startswith("build/"):
                parts = p.split("/")
                if parts[1] not in presets and parts[1] not in ("<preset>", "...", "*") and len(parts) > 2:
                    faults.append(f"README.md:{n}: {p}: build/{parts[1]} is no preset's build directory")
            elif re.match(r"(examples|scripts|bench|tests|kernels|core|nn|optim|train|export|src|include|io|cmake)/[\w./-]+$", p) \
                    and not any(c in p for c in "<>*{}") and not os.path.exists(os.path.join(repo, p.rstrip("."))):
                faults.append(f"README.md:{n}: {p} does not exist")
    if faults:
        print("\n".join(faults))
        return 1
    print(f"readme_code.py: excerpts and paths of {readme} check out")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("generate", "check"):
        sys.stderr.write(__doc__)
        sys.exit(2)
    if sys.argv[1] == "generate":
        generate(sys.argv[2], sys.argv[3])
    else:
        sys.exit(check(sys.argv[2], sys.argv[3]))
