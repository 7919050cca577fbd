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
TIMEY=re.compile(r'(time|bw|_us|usec|secs|timestamp|date|pid|started|ended|duration|percentile|p\d+|mean|median|stddev|cv|min|max|outlier|iter|samples|host_memory|resident|algo)',re.I)
def mask(o,k=''):
    if isinstance(o,dict): return {kk:mask(v,kk) for kk,v in o.items()}
    if isinstance(o,list): return [mask(v,k) for v in o]
    if isinstance(o,(int,float)) and not isinstance(o,bool) and TIMEY.search(k): return 'T'
    if isinstance(o,str) and TIMEY.search(k): return 'T'
    return o
kind,path=sys.argv[1],sys.argv[2]
t=open(path).read()
if kind=='table': print(table(t))
elif kind=='json': print(json.dumps(mask(json.loads(t)),indent=1,sort_keys=True))
elif kind=='csv':
    r=list(csv.reader(io.StringIO(t)))
    h=r[0]
    for row in r[1:]:
        print(','.join('T' if TIMEY.search(h[i]) else v for i,v in enumerate(row)))
    print(','.join(h))
