/**
 * The messages of the `pwkernel` comm target (see pwkernel/notebook/comm.py), their
 * validation, and the sidebar's state, updated by pure functions (unit-tested without a lab).
 *
 * Nothing here imports JupyterLab: the same code runs in the browser and under `node --test`.
 */

export const TARGET = 'pwkernel';
export const PROTOCOL = 1;
export const POLICIES = ['fifo', 'priority', 'share'] as const;
export const DISPATCH_MODES = ['parallel', 'sequential'] as const;
/** A trace export's tracks (`rows`): those of `%pathways trace save --rows` (ROW_MODES). */
export const ROW_MODES = ['auto', 'device', 'host', 'island'] as const;
export type Policy = (typeof POLICIES)[number];
export type DispatchMode = (typeof DISPATCH_MODES)[number];
export type RowMode = (typeof ROW_MODES)[number];

// --- requests (frontend -> kernel) ----------------------------------------------------------
export type Request =
  | { type: 'status'; id?: number }
  | { type: 'subscribe'; interval: number; id?: number }
  | { type: 'unsubscribe'; id?: number }
  | { type: 'policy'; policy: Policy; id?: number }
  | { type: 'dispatch'; dispatch: DispatchMode; id?: number }
  | { type: 'cancel'; run: number; id?: number }
  | { type: 'trace'; path?: string; rows?: RowMode; id?: number };

/** A policy request, refusing anything the kernel would refuse. */
export function policyRequest(policy: string): Request {
  if (!(POLICIES as readonly string[]).includes(policy)) {
    throw new ProtocolError(
      `policy must be one of ${POLICIES.join(', ')}; got ${JSON.stringify(policy)}.`
    );
  }
  return { type: 'policy', policy: policy as Policy };
}

/** A cancel request for run id `run` (an integer >= 0 from the status `runs`). */
export function cancelRequest(run: number): Request {
  if (!Number.isInteger(run) || run < 0) {
    throw new ProtocolError(`a run id is an integer >= 0; got ${JSON.stringify(run)}.`);
  }
  return { type: 'cancel', run };
}

/** A trace request with tracks `rows` (one of ROW_MODES), refusing anything else. */
export function traceRequest(rows: string): Request {
  if (!(ROW_MODES as readonly string[]).includes(rows)) {
    throw new ProtocolError(
      `trace rows must be one of ${ROW_MODES.join(', ')}; got ${JSON.stringify(rows)}.`
    );
  }
  return { type: 'trace', rows: rows as RowMode };
}

// How the panel words numbers, meshes and the controller (src/format.ts).
export { controllerText, formatBytes, sliceMesh } from './format';

// --- replies (kernel -> frontend) -----------------------------------------------------------
export interface IslandInfo {
  id: number;
  platform: string;
  devices: number[];
  running: number;
  queued: number;
  programs_running: number;
  programs_queued: number;
}

export interface DeviceInfo {
  id: number;
  island: number;
  memory: number;
  utilization: number;
  busy: boolean;
  others: Record<string, number>; // a pool's other tenants: busy fraction each ({} if none)
}

/** One tenant of the device pool this kernel's controller shares (`pool.tenants`). */
export interface TenantInfo {
  name: string;
  me: boolean; // this notebook's controller
  color: string; // '#rrggbb': its colour in the schedule view; '' for this notebook
  queued: number;
  running: number;
  share: number; // its part of the pool's device time, 0..1
  device_seconds: number;
  bytes: number;
  devices: number[];
}

/** Another tenant's computation that ended in the last window (`pool.recent`). */
export interface OtherWork {
  tenant: string;
  client: string;
  name: string;
  island: number;
  devices: number[];
  ago: number; // seconds since it ended
  duration: number;
}

export interface PoolInfo {
  name: string;
  tenants: TenantInfo[];
  recent: OtherWork[];
}

export interface RunInfo {
  id: number;
  name: string;
  client: string;
  state: 'running' | 'queued';
  islands: number[];
  running_on: number[];
}

export interface SliceInfo {
  name: string;
  island: number;
  devices: number[];
  shape: number[];
  axis_names: string[]; // empty from a kernel that does not send them
  axis_types: string[]; // 'explicit' or 'auto' per axis; empty when not sent
}

export interface StatusData {
  closed: boolean;
  started: boolean; // false until the kernel's controller starts (first %pathways)
  islands: IslandInfo[];
  devices: DeviceInfo[];
  runs: RunInfo[];
  named_slices: SliceInfo[];
  policy: string;
  dispatch: string;
  pool: PoolInfo | null; // null: the controller is no tenant of a shared pool
}

export type Reply =
  | { type: 'status'; data: StatusData; id?: number | string }
  | { type: 'unsubscribe'; id?: number | string }
  | { type: 'policy'; policy: string; id?: number | string }
  | { type: 'dispatch'; dispatch: string; id?: number | string }
  | { type: 'cancel'; run: number; cancelled: number; id?: number | string }
  | { type: 'trace'; path: string; events: number; rows?: string; id?: number | string }
  | { type: 'error'; error: string; request?: string; id?: number | string };

/** A message from the kernel that does not follow the protocol. */
export class ProtocolError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ProtocolError';
  }
}

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function need<T>(
  obj: Obj,
  key: string,
  ok: (v: unknown) => boolean,
  what: string,
  where: string
): T {
  const v = obj[key];
  if (!ok(v)) {
    throw new ProtocolError(
      `${where}: field '${key}' must be ${what}; got ${JSON.stringify(v)}. ` +
        'Is the kernel running a matching pwkernel version?'
    );
  }
  return v as T;
}

const isInt = (v: unknown) => Number.isInteger(v);
const isNum = (v: unknown) => typeof v === 'number' && Number.isFinite(v);
const isStr = (v: unknown) => typeof v === 'string';
const isBool = (v: unknown) => typeof v === 'boolean';
const isInts = (v: unknown) => Array.isArray(v) && v.every(isInt);
const isArr = (v: unknown) => Array.isArray(v);
const isFraction = (v: unknown) => isNum(v) && (v as number) >= 0 && (v as number) <= 1;
// a colour goes into a style attribute: only '#rrggbb' (or '' for this notebook's tenant)
const isColor = (v: unknown) => v === '' || (isStr(v) && /^#[0-9A-Fa-f]{6}$/.test(v as string));

function list<T>(obj: Obj, key: string, where: string, item: (v: Obj, w: string) => T): T[] {
  const arr = need<unknown[]>(obj, key, isArr, 'a list', where);
  return arr.map((v, i) => {
    const w = `${where}.${key}[${i}]`;
    if (!isObj(v)) {
      throw new ProtocolError(`${w} must be an object; got ${JSON.stringify(v)}.`);
    }
    return item(v, w);
  });
}

function island(v: Obj, w: string): IslandInfo {
  return {
    id: need(v, 'id', isInt, 'an int', w),
    platform: need(v, 'platform', isStr, 'a string', w),
    devices: need(v, 'devices', isInts, 'a list of ints', w),
    running: need(v, 'running', isInt, 'an int', w),
    queued: need(v, 'queued', isInt, 'an int', w),
    programs_running: need(v, 'programs_running', isInt, 'an int', w),
    programs_queued: need(v, 'programs_queued', isInt, 'an int', w)
  };
}

function device(v: Obj, w: string): DeviceInfo {
  const utilization = need<number>(v, 'utilization', isNum, 'a number in [0, 1]', w);
  if (utilization < 0 || utilization > 1) {
    throw new ProtocolError(`${w}: utilization must be in [0, 1]; got ${utilization}.`);
  }
  const others = v.others === undefined ? {} : v.others;
  if (!isObj(others) || !Object.values(others).every(isFraction)) {
    throw new ProtocolError(
      `${w}: others must map tenant names to numbers in [0, 1]; got ${JSON.stringify(others)}.`
    );
  }
  return {
    id: need(v, 'id', isInt, 'an int', w),
    island: need(v, 'island', isInt, 'an int', w),
    memory: need(v, 'memory', isInt, 'an int (bytes)', w),
    utilization,
    busy: need(v, 'busy', isBool, 'a boolean', w),
    others: others as Record<string, number>
  };
}

function tenant(v: Obj, w: string): TenantInfo {
  return {
    name: need(v, 'name', isStr, 'a string', w),
    me: need(v, 'me', isBool, 'a boolean', w),
    color: need(v, 'color', isColor, "'#rrggbb' or ''", w),
    queued: need(v, 'queued', isInt, 'an int', w),
    running: need(v, 'running', isInt, 'an int', w),
    share: need(v, 'share', isFraction, 'a number in [0, 1]', w),
    device_seconds: need(v, 'device_seconds', isNum, 'a number', w),
    bytes: need(v, 'bytes', isInt, 'an int (bytes)', w),
    devices: need(v, 'devices', isInts, 'a list of ints', w)
  };
}

function otherWork(v: Obj, w: string): OtherWork {
  return {
    tenant: need(v, 'tenant', isStr, 'a string', w),
    client: need(v, 'client', isStr, 'a string', w),
    name: need(v, 'name', isStr, 'a string', w),
    island: need(v, 'island', isInt, 'an int', w),
    devices: need(v, 'devices', isInts, 'a list of ints', w),
    ago: need(v, 'ago', isNum, 'a number (seconds)', w),
    duration: need(v, 'duration', isNum, 'a number (seconds)', w)
  };
}

/** The status's `pool` (absent or null: no pool). */
function pool(data: Obj, where: string): PoolInfo | null {
  if (data.pool === undefined || data.pool === null) {
    return null;
  }
  const w = `${where}.pool`;
  const v = need<Obj>(data, 'pool', isObj, 'an object or null', where);
  return {
    name: need(v, 'name', isStr, 'a string', w),
    tenants: list(v, 'tenants', w, tenant),
    recent: list(v, 'recent', w, otherWork)
  };
}

function run(v: Obj, w: string): RunInfo {
  return {
    id: need(v, 'id', isInt, 'an int', w),
    name: need(v, 'name', isStr, 'a string', w),
    client: need(v, 'client', isStr, 'a string', w),
    state: need(v, 'state', s => s === 'running' || s === 'queued', "'running' or 'queued'", w),
    islands: need(v, 'islands', isInts, 'a list of ints', w),
    running_on: need(v, 'running_on', isInts, 'a list of ints', w)
  };
}

function slice(v: Obj, w: string): SliceInfo {
  return {
    name: need(v, 'name', isStr, 'a string', w),
    island: need(v, 'island', isInt, 'an int', w),
    devices: need(v, 'devices', isInts, 'a list of ints', w),
    shape: need(v, 'shape', isInts, 'a list of ints', w),
    axis_names: optionalStrings(v, 'axis_names', w),
    axis_types: optionalStrings(v, 'axis_types', w)
  };
}

function optionalStrings(v: Obj, key: string, w: string): string[] {
  if (v[key] === undefined) {
    return [];
  }
  return need(
    v,
    key,
    (x): x is string[] => Array.isArray(x) && x.every(isStr),
    'a list of strings',
    w
  );
}

/** Validate a status reply's `data`; a closed controller gives empty lists. */
export function parseStatus(data: unknown): StatusData {
  const where = 'status.data';
  if (!isObj(data)) {
    throw new ProtocolError(`${where} must be an object; got ${JSON.stringify(data)}.`);
  }
  if (data.closed === true) {
    return {
      closed: true,
      started: true,
      islands: [],
      devices: [],
      runs: [],
      named_slices: [],
      policy: '',
      dispatch: '',
      pool: null
    };
  }
  const protocol = need<number>(data, 'protocol', isInt, 'an int', where);
  if (protocol !== PROTOCOL) {
    throw new ProtocolError(
      `the kernel speaks protocol ${protocol}, this sidebar ${PROTOCOL}; install the same ` +
        'pwkernel version in the kernel and in JupyterLab.'
    );
  }
  return {
    closed: false,
    started: data.started !== false,
    islands: list(data, 'islands', where, island),
    devices: list(data, 'devices', where, device),
    runs: list(data, 'runs', where, run),
    named_slices: list(data, 'named_slices', where, slice),
    policy: need(data, 'policy', isStr, 'a string', where),
    dispatch: need(data, 'dispatch', isStr, 'a string', where),
    pool: pool(data, where)
  };
}

/** Validate one message from the kernel; throws `ProtocolError` naming what was wrong. */
export function parseReply(raw: unknown): Reply {
  if (!isObj(raw) || typeof raw.type !== 'string') {
    throw new ProtocolError(
      `expected a JSON object with a string 'type' from the kernel; got ${JSON.stringify(raw)}.`
    );
  }
  const w = `'${raw.type}' reply`;
  const id = raw.id;
  if (id !== undefined && !isInt(id) && !isStr(id)) {
    throw new ProtocolError(`${w}: 'id' must be an int or a string; got ${JSON.stringify(id)}.`);
  }
  const base = id === undefined ? {} : { id: id as number | string };
  switch (raw.type) {
    case 'status':
      return { type: 'status', data: parseStatus(raw.data), ...base };
    case 'unsubscribe':
      return { type: 'unsubscribe', ...base };
    case 'policy':
      return { type: 'policy', policy: need(raw, 'policy', isStr, 'a string', w), ...base };
    case 'dispatch':
      return { type: 'dispatch', dispatch: need(raw, 'dispatch', isStr, 'a string', w), ...base };
    case 'cancel':
      return {
        type: 'cancel',
        run: need(raw, 'run', isInt, 'an int', w),
        cancelled: need(raw, 'cancelled', isInt, 'an int', w),
        ...base
      };
    case 'trace':
      return {
        type: 'trace',
        path: need(raw, 'path', isStr, 'a string', w),
        events: need(raw, 'events', isInt, 'an int', w),
        ...(isStr(raw.rows) ? { rows: raw.rows as string } : {}), // (older kernels send none)
        ...base
      };
    case 'error': {
      const request = raw.request;
      return {
        type: 'error',
        error: need(raw, 'error', isStr, 'a string', w),
        ...(isStr(request) ? { request: request as string } : {}),
        ...base
      };
    }
    default:
      throw new ProtocolError(
        `unknown reply type ${JSON.stringify(raw.type)}; this sidebar understands status, ` +
          'unsubscribe, policy, dispatch, cancel, trace and error.'
      );
  }
}

// --- the sidebar's state --------------------------------------------------------------------
export type Connection =
  | 'no-notebook' // no notebook is active
  | 'no-kernel' // the notebook has no kernel (yet)
  | 'connecting' // comm opened, waiting for the first status
  | 'connected'
  | 'not-loaded' // the kernel has no `pwkernel` comm target: offer "Load pwkernel"
  | 'loading' // running %load_ext pwkernel
  | 'restarting'; // the kernel restarts; reconnect when it is idle

export interface State {
  connection: Connection;
  kernelName: string;
  status: StatusData | null;
  message: string; // the last notice (an action's result) or error, '' for none
  error: boolean;
  tracePath: string;
}

export function initialState(): State {
  return {
    connection: 'no-notebook',
    kernelName: '',
    status: null,
    message: '',
    error: false,
    tracePath: ''
  };
}

/** The state after the connection changes (a new notebook, kernel, restart, load). */
export function withConnection(state: State, connection: Connection, kernelName = ''): State {
  const keep = connection === 'connected';
  return {
    ...state,
    connection,
    kernelName: kernelName || (keep ? state.kernelName : ''),
    status: keep ? state.status : null
  };
}

/** The state after one (validated) reply from the kernel. */
export function applyReply(state: State, reply: Reply): State {
  switch (reply.type) {
    case 'status':
      return { ...state, connection: 'connected', status: reply.data };
    case 'policy':
      return {
        ...state,
        status: state.status && { ...state.status, policy: reply.policy },
        message: `policy: ${reply.policy}`,
        error: false
      };
    case 'dispatch':
      return {
        ...state,
        status: state.status && { ...state.status, dispatch: reply.dispatch },
        message: `dispatch: ${reply.dispatch}`,
        error: false
      };
    case 'cancel':
      return {
        ...state,
        message: `run ${reply.run}: ${reply.cancelled} computation(s) cancelled`,
        error: false
      };
    case 'trace': {
      const rows = reply.rows ? `, rows: ${reply.rows}` : '';
      return {
        ...state,
        tracePath: reply.path,
        message: `trace saved (${reply.events} events${rows}): ${reply.path}`,
        error: false
      };
    }
    case 'error':
      return { ...state, message: reply.error, error: true };
    case 'unsubscribe':
      return state;
  }
}
