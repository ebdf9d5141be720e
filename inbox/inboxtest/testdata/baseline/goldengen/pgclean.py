import sys, re
schema = sys.argv[1]
out = []
for line in open(sys.argv[2]):
    l = line.rstrip('\n')
    if l.startswith('\\') or l.startswith('SET ') or 'pg_catalog.set_config' in l or l.startswith('CREATE SCHEMA') or l.startswith('--'):
        continue
    l = l.replace(schema + '.', '')
    out.append(l)
text = '\n'.join(out)
text = re.sub(r'\n{3,}', '\n\n', text).strip() + '\n'
sys.stdout.write(text)
