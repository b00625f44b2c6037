import math
P=132
def schedule_group(num_tiles, num_bh):
    total=num_tiles*num_bh; programs=min(total,P)
    g=next(g for g in range(1,num_bh+1) if num_bh%g==0 and (g*num_tiles>=2*programs or g==num_bh))
    return programs,g
def sim(num_tiles,num_bh,bm,bn,n,overhead):
    programs,hg=schedule_group(num_tiles,num_bh)
    per_group=2*math.ceil(num_tiles*hg/(2*programs))
    turns=math.ceil(num_bh/hg)*per_group
    work=[0.0]*programs
    for p0 in range(programs):
        for i in range(turns):
            group=i//per_group; s=i-group*per_group
            p=p0 if group%2==0 else programs-1-p0
            j=2*programs*(s//2)+(p if s%2==0 else 2*programs-1-p)
            size=min(num_bh-group*hg,hg)
            if j>=size*num_tiles: continue
            rank=j//size; tile=num_tiles-1-rank
            hi=min(n,(tile+1)*bm); blocks=math.ceil(hi/bn)
            work[p0]+=blocks+overhead
    tot=sum(work); ideal=tot/programs
    return max(work)/ideal, programs, hg, turns
for name,(b,h,n,d) in {"GQA32/8 B4 N4096 D128":(4,32,4096,128),"GQA32/8 B1 N16384":(1,32,16384,128),"GQA64/8 B1 N16384":(1,64,16384,128),
    "MHA D128 B2 H16 N8192":(2,16,8192,128),"MHA D64 B2 H16 N8192":(2,16,8192,64),"MHA D64 B4 H32 N4096":(4,32,4096,64)}.items():
    bm=192 if d==64 else 128
    for oh in (0,1.5):
        r=sim(math.ceil(n/bm),b*h,bm,128,n,oh)
        print(f"{name:25s} overhead {oh}: max/mean {r[0]:.4f} programs {r[1]} group {r[2]} turns {r[3]}")
import heapq
def tile_work(num_tiles,bm,bn,n,oh):
    return [math.ceil(min(n,(t+1)*bm)/bn)+oh for t in range(num_tiles)]
def static(num_tiles,num_bh,bm,bn,n,oh,hg):
    programs=min(num_tiles*num_bh,P)
    per_group=2*math.ceil(num_tiles*hg/(2*programs)); turns=math.ceil(num_bh/hg)*per_group
    w=tile_work(num_tiles,bm,bn,n,oh); work=[0.0]*programs
    for p0 in range(programs):
        for i in range(turns):
            group=i//per_group; s=i-group*per_group
            p=p0 if group%2==0 else programs-1-p0
            j=2*programs*(s//2)+(p if s%2==0 else 2*programs-1-p)
            size=min(num_bh-group*hg,hg)
            if j>=size*num_tiles: continue
            work[p0]+=w[num_tiles-1-j//size]
    return max(work)/(sum(work)/programs)
def dynamic(num_tiles,num_bh,bm,bn,n,oh,hg):
    w=tile_work(num_tiles,bm,bn,n,oh)
    order=[]
    for g0 in range(0,num_bh,hg):
        size=min(num_bh-g0,hg)
        for j in range(size*num_tiles): order.append(w[num_tiles-1-j//size])
    h=[(0.0,p) for p in range(P)]
    for x in order:
        t,p=heapq.heappop(h); heapq.heappush(h,(t+x,p))
    return max(t for t,_ in h)/(sum(order)/P)
print()
for name,(b,h,n,d) in {"GQA32/8 B1 N16384":(1,32,16384,128),"MHA D128 B2 H16 N8192":(2,16,8192,128),"MHA D64 B2 H16 N8192":(2,16,8192,64),"MHA D64 B4 H32 N4096":(4,32,4096,64),"MHA D64 B1 H16 N16384":(1,16,16384,64),"GQA D64 B1 N16384":(1,32,16384,64)}.items():
    bm=192 if d==64 else 128; nt=math.ceil(n/bm); bh=b*h
    res=[]
    for g in [g for g in range(1,bh+1) if bh%g==0]:
        if g*nt<P: continue
        res.append(f"g{g}: s{static(nt,bh,bm,128,n,1.5,g):.3f} d{dynamic(nt,bh,bm,128,n,1.5,g):.3f}")
    print(f"{name:24s} chosen g{schedule_group(nt,bh)[1]} | "+"  ".join(res))
print()
for name,(b,h,n,d) in {"GQA32/8 B4 N4096":(4,32,4096,128),"GQA32/8 B1 N16384":(1,32,16384,128),"GQA64/8 B1 N16384":(1,64,16384,128),"MHA D128 B2 H16 N8192":(2,16,8192,128),"MHA D64 B2 H16 N8192":(2,16,8192,64),"MHA D64 B4 H32 N4096":(4,32,4096,64),"MHA D64 B1 H16 N16384":(1,16,16384,64),"GQA D64 B1 N16384":(1,32,16384,64),"GQA D64 B4 N4096":(4,32,4096,64)}.items():
    bm=192 if d==64 else 128; nt=math.ceil(n/bm); bh=b*h
    out=[]
    for mult in (2,3,4,6):
        g=next(g for g in range(1,bh+1) if bh%g==0 and (g*nt>=mult*P or g==bh))
        out.append(f"x{mult}: g{g} {static(nt,bh,bm,128,n,1.5,g):.3f}")
    print(f"{name:24s} "+"  ".join(out))
