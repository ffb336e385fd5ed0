//! A `moto_server` on a free loopback port, with a VPC, two subnets and (optionally) EC2 instances
//! made through moto's own EC2, so that subnet and instance IDs are real ones. It talks to
//! nothing but this server and is stopped when dropped. Used by the AWS provider's tests and
//! benchmark and by the chart's RBAC test.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Moto {
    child: Child,
    pub url: String,
    pub subnets: Vec<String>,
    pub instances: Vec<String>,
    /// The venv's Python, beside `moto_server`, with boto3.
    pub python: PathBuf,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The repository's venv (`make deps` builds it), else `PATH`.
fn venv_bin(name: &str) -> Option<PathBuf> {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../.venv/bin")
        .join(name);
    if venv.exists() {
        return Some(venv);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.exists())
    })
}

/// Starts moto from the repository's venv; `Err(reason)` when it is not installed.
pub fn start(instances: usize) -> Result<Moto, String> {
    let server = venv_bin("moto_server")
        .ok_or("moto_server not found (make deps installs it into .venv)")?;
    start_with(&server.with_file_name("python"), instances)
}

/// Starts the `moto_server` beside `python` (a venv's).
pub fn start_with(python: &Path, instances: usize) -> Result<Moto, String> {
    let server = python.with_file_name("moto_server");
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let child = Command::new(&server)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", server.display()))?;
    let mut moto = Moto {
        child,
        url: format!("http://127.0.0.1:{port}"),
        subnets: Vec::new(),
        instances: Vec::new(),
        python: python.to_path_buf(),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err("moto_server did not listen within 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let script = format!(
        r#"
import boto3, json
ec2 = boto3.client("ec2", endpoint_url="{url}", region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=c, AvailabilityZone=z)["Subnet"]["SubnetId"]
           for c, z in (("10.0.1.0/24", "us-east-1a"), ("10.0.2.0/24", "us-east-1b"))]
ids = []
if {n}:
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12c6146b", MinCount={n}, MaxCount={n}, SubnetId=subnets[0])["Instances"]]
print(json.dumps({{"subnets": subnets, "instances": ids}}))
"#,
        url = moto.url,
        n = instances
    );
    let out = Command::new(python)
        .args(["-c", &script])
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "setting up EC2 in moto failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let strings = |k: &str| -> Vec<String> {
        v[k].as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    moto.subnets = strings("subnets");
    moto.instances = strings("instances");
    Ok(moto)
}

impl Moto {
    /// The server's process id (a test may stop it with SIGSTOP to make calls hang).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Runs Python (boto3, `elb` an ELBv2 client of this server) for what the code under test
    /// must not do itself, such as making someone else's resources.
    pub fn python(&self, code: &str) -> Result<String, String> {
        let prelude = format!(
            "import boto3, json\nelb = boto3.client('elbv2', endpoint_url='{}', region_name='us-east-1', aws_access_key_id='testing', aws_secret_access_key='testing')\n",
            self.url
        );
        let out = Command::new(&self.python)
            .args(["-c", &(prelude + code)])
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}
