#!/usr/bin/env python3
"""Lists the longest C++ functions (a brace-matching heuristic; string literals
are blanked first). Kernels and generated tables are left out.

  tools/lint/long_functions.py [LIMIT] [DIR...]   (default 120, the whole tree)
"""
import re, sys, os
limit = int(sys.argv[1]) if len(sys.argv) > 1 else 120
roots = sys.argv[2:] or ['common', 'services', 'tools', 'tests', 'bench']
skip = ('third_party', 'kernels/', 'bazel-', '.device', 'unicode_tables')
res = []
sig = re.compile(r'^\s*(?:[\w:<>,\*&~\[\]\s]+?\s+)?[~\w:]+(?:<[^>]*>)?\s*\([^;]*\)\s*(?:const)?\s*(?:override)?\s*(?:noexcept)?\s*(?:->\s*[\w:<>]+\s*)?(?:ABSL_[A-Z_]+\([^)]*\)\s*)*\{\s*$')
for root in roots:
  for d, _, files in os.walk(root):
    if any(s in d for s in skip): continue
    for f in files:
      if not f.endswith(('.cc', '.h', '.cu')): continue
      p = os.path.join(d, f)
      src = open(p, errors='ignore').read()
      src = re.sub(r'R"\((.*?)\)"', lambda m: 'R""' + '\n' * m.group(1).count('\n'), src, flags=re.S)
      src = re.sub(r'"(\\.|[^"\\\n])*"', '""', src)
      src = re.sub(r"'(\\.|[^'\\\n])'", "''", src)
      lines = src.split('\n')
      i = 0
      while i < len(lines):
        l = lines[i]
        # join a multi-line signature: look back for lines without ; or { or }
        if l.rstrip().endswith('{') and not re.match(r'^\s*(if|for|while|switch|else|do|namespace|class|struct|enum|union|try|catch|extern)\b', l) and '=' not in l.split('(')[0]:
          j = i; text = l
          while j > 0 and not re.search(r'[;{}]\s*$|^\s*$|^\s*//|^\s*#|:\s*$', lines[j-1]) and i - j < 8:
            j -= 1; text = lines[j] + ' ' + text
          if '(' in text and not re.match(r'^\s*(if|for|while|switch|return)\b', text.strip()) and not text.strip().startswith(('[', '{')) and ')' in text:
            depth = 0; k = i
            for k in range(i, len(lines)):
              depth += lines[k].count('{') - lines[k].count('}')
              if depth <= 0: break
            n = k - j + 1
            if n > limit:
              name = re.sub(r'\s+', ' ', text.split('(')[0]).strip().split(' ')[-1]
              res.append((n, p, j + 1, name))
        i += 1
for n, p, ln, name in sorted(res, reverse=True):
  print(f'{n:5d} {p}:{ln} {name}')
