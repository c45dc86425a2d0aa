"""AR vs a k = 0 engine (T = 1, c = 1), alternating order, 6 rounds: is the forward gap systematic?"""
import json, sys
from tools.step_cost import measure_arm, PLAIN_STEP_ARMS
T=".cache/targets/smollm2-135m-instruct"; D="testbed/smollm2/round3/drafts/dflash"
c=int(sys.argv[1]) if len(sys.argv)>1 else 1
rows=[]
for r in range(6):
    arms=[("AR",0,None),("k0",1,PLAIN_STEP_ARMS["k=0 handed over"])]
    if r%2: arms.reverse()
    for name,k,ps in arms:
        row=measure_arm(T,D,k,c,200,ps,1.0,False,None,"float32"); row["arm"]=name; row["round"]=r
        rows.append(row); print(json.dumps({k:(round(v,3) if isinstance(v,float) else v) for k,v in row.items()}), flush=True)
json.dump(rows, open(f".cache/k0_step_ab_c{c}.json","w"))
