"""Lists the functions longer than a limit (80 lines by default) in the
project's C++ and Python sources, and exits 1 when there is one: the house
rule that keeps every function readable at a glance. C++ functions are
found by their braces (comments, strings, raw strings and preprocessor
lines skipped; a brace opens a function when what precedes it in a
namespace or class body ends a parameter list); Python ones by the ast.

    python3 scripts/function_lengths.py [--limit N] [ROOT]
"""
import ast
import os
import re
import sys

SKIPPED_DIRS = {".git", ".venv", "docs", "__pycache__"}


def blank_literals(src):
    """`src` with comments and string literals blanked (newlines kept)."""
    out, i, n = [], 0, len(src)
    blank = lambda text: re.sub(r"[^\n]", " ", text)  # noqa: E731
    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif src.startswith('R"', i) and (m := re.match(r'R"([^(\s]*)\(', src[i:])):
            end = src.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
        elif src[i] in "\"'":
            j = i + 1
            while j < n and src[j] != src[i] and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            j += 1
        else:
            out.append(src[i])
            i += 1
            continue
        out.append(blank(src[i:j]))
        i = j
    text = "".join(out)
    return "\n".join("" if line.lstrip().startswith("#") else line
                     for line in text.split("\n"))


def cpp_functions(path):
    """(lines, line, signature) of each function defined in a C++ file."""
    with open(path, errors="replace") as f:
        text = blank_literals(f.read())
    stack, last, line, found = [], 0, 1, []
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == ";":
            last = i + 1
        elif c == "{":
            head = " ".join(text[last:i].split())
            scope = stack[-1][0] if stack else "namespace"
            if re.search(r'\bnamespace\b|^extern\b', head):
                kind = "namespace"
            elif scope in ("namespace", "class") and re.search(
                    r"\b(class|struct|union|enum)\b[^()]*$", head):
                kind = "class"
            elif (scope in ("namespace", "class") and ")" in head
                  and not re.match(r"(if|for|while|switch|catch|do|else)\b", head)
                  and "=" not in head.split("(")[0]):
                kind = "function"
            else:
                kind = "block"
            stack.append((kind, line, head[-70:]))
            last = i + 1
        elif c == "}":
            if stack:
                kind, start, head = stack.pop()
                if kind == "function":
                    found.append((line - start + 1, start, head))
            last = i + 1
    return found


def python_functions(path):
    with open(path) as f:
        tree = ast.parse(f.read())
    return [(node.end_lineno - node.lineno + 1, node.lineno, node.name)
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def main():
    args = sys.argv[1:]
    limit = 80
    if args[:1] == ["--limit"]:
        limit, args = int(args[1]), args[2:]
    top = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    long = []
    for root, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("build"))
        for name in sorted(files):
            path = os.path.join(root, name)
            if name.endswith((".cc", ".h", ".cpp")):
                functions = cpp_functions(path)
            elif name.endswith(".py"):
                functions = python_functions(path)
            else:
                continue
            long += [(n, os.path.relpath(path, top), at, what)
                     for n, at, what in functions if n > limit]
    for n, path, at, what in sorted(long, reverse=True):
        print(f"{path}:{at}: {n} lines: {what}")
    if long:
        print(f"{len(long)} functions over {limit} lines: split them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
