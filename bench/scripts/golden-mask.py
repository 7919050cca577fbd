#!/usr/bin/env python3
"""Masks the measured values of a busbw run (golden-diff.sh): table, JSON or CSV on stdout."""
import json, re, sys, csv, io
def table(t):
    out=[]
    for l in t.splitlines():
        # Whether a variance or cold-start warning is printed is itself measured.
        if 'Warning:' in l:
            continue
        l=re.sub(r'Pid +\d+','Pid N',l)
        f=l.split()
        if f and f[0].isdigit() and len(f)>=13:
            f[5]=f[6]=f[7]='T'; f[9]=f[10]=f[11]='T'; l=' '.join(f)
        if l.startswith('# Avg bus bandwidth'): l='# Avg bus bandwidth T'
        out.append(l)
    return '\n'.join(out)
# Exactly the measured values: a key that merely contains "min", "max" or "iter" (the plan's
# min_bytes, iters) is configuration and must compare equal.
MEASURED=re.compile(r'(_us|_pct|_gbps|^algbw$|^busbw$|^avg_busbw$|^start_time$|^end_time$|^pid$|^args$)')
def measured(key, parent):
    # A row's algorithm is auto's measured choice; the plan's is the flag.
    return bool(MEASURED.search(key)) or (key == 'algo' and parent != 'plan')
def mask(o,k='',parent=''):
    if isinstance(o,dict): return {kk:mask(v,kk,k) for kk,v in o.items()}
    if isinstance(o,list): return 'T' if measured(k,parent) else [mask(v,k,parent) for v in o]
    return 'T' if measured(k,parent) else o
kind,path=sys.argv[1],sys.argv[2]
t=open(path).read()
if kind=='table': print(table(t))
elif kind=='json': print(json.dumps(mask(json.loads(t)),indent=1,sort_keys=True))
elif kind=='csv':
    r=list(csv.reader(io.StringIO(t)))
    h=r[0]
    for row in r[1:]:
        print(','.join('T' if measured(h[i],'rows') else v for i,v in enumerate(row)))
    print(','.join(h))
